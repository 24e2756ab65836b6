"""Lightning ``Trainer``'s snapshots: its own checkpoint, kept in memory every N steps.

The callback saves at an optimizer step's end (the batch where ``global_step`` moved, as
``ModelCheckpoint(every_n_train_steps)`` does) what Lightning's checkpoint holds: the model's,
optimizers' and schedulers' states, the loops' counters and the callbacks' states, with what is
no tensor or plain value left out (said once). On a restart Lightning's checkpoint loading is
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
import time
from typing import Any, Optional, Tuple

from . import api as snapshot
from ...procs.trainer_hooks import with_lightning_callback
from .trainers import Dropped, first_load, gang_max, new_cadence, owned, plain, rank, resume_dir, say

CALLBACK_NAME = "TorchrunSnapshots"
FORMAT = "lightning-1"
_SHARDED = ("FSDP", "DeepSpeed", "ModelParallel", "XLA")


def patch(module: Any) -> None:
    package = with_lightning_callback(module, lightning_callback, CALLBACK_NAME, "_torchrun_snapshots")
    if package is None:
        return
    connectors = importlib.import_module(package + ".trainer.connectors.checkpoint_connector")
    wrap_resume_start(connectors._CheckpointConnector)


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
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        held = {"format": FORMAT, "checkpoint": plain(checkpoint, "checkpoint", dropped)}
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
    if not any(type(c).__name__ == CALLBACK_NAME for c in getattr(trainer, "callbacks", [])):
        return False
    return not _sharded(trainer) and first_load()


def load_for(trainer: Any) -> Optional[Tuple[int, dict]]:
    """The gang's snapshot, where every rank finds it fits this trainer's model; else None, said why."""
    try:
        resumed = snapshot.load()
    except Exception as e:
        say("Lightning starts as asked, not from a snapshot: %s" % e, once="pl load")
        return None
    if resumed is None:
        return None
    why = unfit(resumed[1], trainer.lightning_module)
    if gang_max(1 if why else 0):
        say("the snapshot of step %d is not used (%s): Lightning starts as asked" % (resumed[0], why or
                                                                                   "on another rank"))
        return None
    return resumed


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
