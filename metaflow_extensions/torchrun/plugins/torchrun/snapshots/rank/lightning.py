"""Lightning ``Trainer``'s snapshots: its own checkpoint, kept in memory every N steps.

The callback saves at an optimizer step's end (the batch where ``global_step`` moved, as
``ModelCheckpoint(every_n_train_steps)`` does) what Lightning's checkpoint holds: the model's,
optimizers' and schedulers' states, the loops' counters and the callbacks' states, with what is
no tensor or plain value left out (said once), and each RNG (Python, numpy, torch's CPU and CUDA),
which Lightning's checkpoint does not keep: set back before the first batch after the resume. The
``on_save_checkpoint`` hooks (your module's, datamodule's and callbacks') run at your checkpoints only,
not at a snapshot: what they add to a checkpoint is not in one (your ``on_load_checkpoint`` gets a
snapshot's without it). On a restart Lightning's checkpoint loading is
handed a file written from the snapshot, where ``fit`` was given no ``ckpt_path``: that happens
in ``resume_start``, past ``init_process_group`` (inside ``fit``), where the ranks can agree on
the step. Lightning restores the data position only for a loader with ``state_dict`` (its
``_Stateful``); a plain ``DataLoader`` starts its epoch again (Lightning's own warning says so).
"""

from __future__ import annotations

import functools
import importlib
import os
import shutil
import threading
import time
from typing import Any, Optional, Tuple

from . import api as snapshot
from ...procs.trainer_hooks import with_lightning_callback
from .trainers import (Dropped, first_load, load_fitting, new_cadence, owned, plain, rank, resume_dir, rng_state,
                       say, set_rng)

CALLBACK_NAME = "TorchrunSnapshots"
FORMAT = "lightning-2"  # with the RNG
_SHARDED = ("FSDP", "DeepSpeed", "ModelParallel", "XLA")


def patch(module: Any) -> None:
    package = with_lightning_callback(module, lightning_callback, CALLBACK_NAME, "_torchrun_snapshots")
    if package is None:
        return
    connectors = importlib.import_module(package + ".trainer.connectors.checkpoint_connector")
    wrap_resume_start(connectors._CheckpointConnector)
    quiet_hooks(importlib.import_module(package + ".trainer.call"))


_snapshotting = threading.local()  # set while a snapshot's checkpoint is made: the user's hooks are not run


def quiet_hooks(call: Any) -> None:
    """Lightning's hook callers (``trainer/call.py``, which ``dump_checkpoint`` calls through) skip
    ``on_save_checkpoint`` while a snapshot is made: a user's hook (it logs, uploads, counts checkpoints)
    is for the user's checkpoints."""
    if getattr(call, "_torchrun_snapshots", False):
        return
    callbacks_hook, module_hook = call._call_callbacks_on_save_checkpoint, call._call_lightning_module_hook

    @functools.wraps(callbacks_hook)
    def on_callbacks(trainer: Any, checkpoint: Any) -> Any:
        return None if getattr(_snapshotting, "on", False) else callbacks_hook(trainer, checkpoint)

    @functools.wraps(module_hook)
    def on_module(trainer: Any, hook_name: str, *args: Any, **kwargs: Any) -> Any:
        if hook_name == "on_save_checkpoint" and getattr(_snapshotting, "on", False):
            return None
        return module_hook(trainer, hook_name, *args, **kwargs)

    call._call_callbacks_on_save_checkpoint, call._call_lightning_module_hook = on_callbacks, on_module
    call._torchrun_snapshots = True


def _sharded(trainer: Any) -> bool:
    name = type(getattr(trainer, "strategy", None)).__name__
    if any(word in name for word in _SHARDED):
        say("Lightning's %s: no trainer snapshots (its state is sharded across ranks)" % name, once="pl sharded")
        return True
    return False


def lightning_callback(base: type) -> type:
    class TorchrunSnapshots(base):
        def __init__(self) -> None:
            self.cadence: Any = None
            self.off = False
            self.last = -1
            self.rng: Optional[dict] = None  # a resumed snapshot's RNG, set back before the first batch

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            rng, self.rng = self.rng, None
            if rng is not None:
                set_rng(rng)

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.cadence = None if _sharded(trainer) else new_cadence()
            self.last = trainer.global_step

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            cadence, step = self.cadence, trainer.global_step
            if cadence is None or step == self.last:  # accumulating: no optimizer step since the last call
                return
            self.last = step
            if cadence.due(step) and not self.off:  # due() on every rank: it may agree on N
                start = time.perf_counter()
                self.off = not save_state(trainer, step)
                cadence.saved(time.perf_counter() - start)
            cadence.resume()

    TorchrunSnapshots.__name__ = TorchrunSnapshots.__qualname__ = CALLBACK_NAME
    return TorchrunSnapshots


def save_state(trainer: Any, step: int) -> bool:
    """Whether snapshots go on: never raises into the training."""
    dropped = Dropped()
    try:
        _snapshotting.on = True
        try:
            checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        finally:
            _snapshotting.on = False
        held = {"format": FORMAT, "checkpoint": plain(checkpoint, "checkpoint", dropped),
                "rng": rng_state(distributed=True)}
        if dropped:
            say("left out of Lightning's snapshots (no tensor or plain value): %s" % ", ".join(dropped[:5]),
                once="pl dropped")
        return snapshot.save(step, held)
    except Exception as e:  # a snapshot never stops the training
        say("rank %d: Lightning's snapshots are off: %s: %s" % (rank(), type(e).__name__, e), once="pl off",
            everyone=True)
        return False


def wrap_resume_start(connector: Any) -> None:
    resume_start = connector.resume_start
    if getattr(resume_start, "_torchrun_snapshots", False):
        return

    @functools.wraps(resume_start)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        asked = kwargs["checkpoint_path"] if "checkpoint_path" in kwargs else (args[0] if args else None)
        resumed = None if asked or not _may_resume(self.trainer) else load_for(self.trainer)
        if resumed is None:
            return resume_start(self, *args, **kwargs)
        step, held = resumed
        directory = resume_dir("lightning")
        try:
            path = os.path.join(directory, "snapshot.ckpt")
            import torch

            # Our own state, verified by its digest at load, written for Lightning's loader; nothing
            # here unpickles anything.
            torch.save(owned(held["checkpoint"]), path)
            for callback in _ours(self.trainer):
                callback.rng = owned(held["rng"])  # its own memory: a view would keep the whole snapshot
            del resumed, held  # Lightning reads the file: the snapshot's copy goes now (its RNG's tensors stay)
            if args:
                args = (path,) + args[1:]
            else:
                kwargs["checkpoint_path"] = path
            say("Lightning resumes at step %d from the snapshot through its own checkpoint loading" % step)
            return resume_start(self, *args, **kwargs)  # reads the file whole: it can go at once
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    wrapped._torchrun_snapshots = True  # type: ignore[attr-defined]
    connector.resume_start = wrapped


def _may_resume(trainer: Any) -> bool:
    fn = getattr(getattr(trainer, "state", None), "fn", None)
    if str(getattr(fn, "value", fn)) != "fit":
        return False
    if not _ours(trainer):
        return False
    return not _sharded(trainer) and first_load()


def _ours(trainer: Any) -> list:
    return [c for c in getattr(trainer, "callbacks", []) if type(c).__name__ == CALLBACK_NAME]


def load_for(trainer: Any) -> Optional[Tuple[int, dict]]:
    """The gang's snapshot, where every rank finds it fits this trainer's model; else None, said why."""
    return load_fitting("Lightning", trainer.lightning_module, unfit, once="pl load")


def unfit(held: Any, module: Any) -> Optional[str]:
    if not isinstance(held, dict) or held.get("format") != FORMAT or not isinstance(held.get("checkpoint"), dict):
        return "not a Lightning snapshot of this version"
    saved = held["checkpoint"].get("state_dict")
    mine = module.state_dict() if module is not None else {}
    if not isinstance(saved, dict) or set(saved) != set(mine):
        return "its model's parameters are named otherwise"
    for name, tensor in mine.items():
        if getattr(saved[name], "shape", None) != tensor.shape:
            return "%s is %s here, %s in it" % (name, tuple(tensor.shape), tuple(getattr(saved[name], "shape", ())))
    return None
