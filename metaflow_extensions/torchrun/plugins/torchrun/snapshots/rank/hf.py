"""HF ``Trainer``'s snapshots: what its own checkpoint holds, kept in memory every N steps.

The callback saves at a step's end what HF's ``_save_checkpoint`` writes a moment later: the
model's and optimizer's state, the scheduler's, each RNG (Python, numpy, torch's CPU and CUDA)
and the trainer state (``trainer_state.json``'s text: global step, epoch). On a restart,
``Trainer.train`` called without ``resume_from_checkpoint`` is handed a checkpoint directory
written from the snapshot, so HF's own resume path restores all of it and skips the batches
already seen; the snapshot's copy is let go once the directory is written, and the directory is removed
at the first step, once HF has read it. FSDP and DeepSpeed trainers keep
their state sharded across ranks: they are left alone (said once), as the trainer itself decides it
(``sharded_by``: accelerate's, whether from ``TrainingArguments`` or accelerate's own config).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import time
from typing import Any, Optional, Tuple

from . import api as snapshot
from .trainers import (Dropped, first_load, load_fitting, new_cadence, owned, plain, rank, resume_dir, rng_state,
                       rng_values, say, tensor_text, text_tensor)

CALLBACK_NAME = "TorchrunSnapshots"
FORMAT = "hf-trainer-1"  # a snapshot of another layout is not used


def patch(module: Any) -> None:
    from transformers.trainer_callback import TrainerCallback

    defaults = module.DEFAULT_CALLBACKS
    if not any(getattr(c, "__name__", "") == CALLBACK_NAME for c in defaults):
        defaults.append(hf_callback(TrainerCallback))
    wrap_train(module.Trainer)


def sharded_by(args: Any, trainer: Any = None) -> Optional[str]:
    """"FSDP" or "DeepSpeed" where the trainer keeps its state sharded across ranks, else None. The
    trainer's own flags are accelerate's decision, whatever asked for it: ``TrainingArguments``'
    ``fsdp``/``fsdp_config`` or ``deepspeed``, or accelerate's config (``accelerate launch``'s, or
    ``ACCELERATE_USE_FSDP=true``), which leaves the arguments' ``fsdp`` empty; the arguments stand
    alone where the trainer is not known."""
    if getattr(trainer, "is_fsdp_enabled", False) or getattr(args, "fsdp", None):
        return "FSDP"
    if getattr(trainer, "is_deepspeed_enabled", False) or getattr(args, "deepspeed", None):
        return "DeepSpeed"
    return None


def _sharded(why: Optional[str]) -> bool:
    if why:
        say("HF Trainer with %s: no trainer snapshots (its state is sharded across ranks): a restart resumes "
            "from your checkpoint" % why, once="hf sharded")
    return bool(why)


def _distributed(args: Any) -> bool:
    return getattr(getattr(args, "parallel_mode", None), "value", None) == "distributed"


def hf_callback(base: type) -> type:
    class TorchrunSnapshots(base):
        def __init__(self) -> None:
            self.cadence: Any = None
            self.off = False
            self.sharded: Optional[str] = None  # its trainer's, told by the trainer's train() (wrap_train)
            self.resume_dir: Optional[str] = None  # the checkpoint written from a snapshot, until HF has read it

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.cadence = None if _sharded(self.sharded or sharded_by(args)) else new_cadence()

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            """HF read the resume's last file (its RNG) just before: the directory goes now, not with train()."""
            directory, self.resume_dir = self.resume_dir, None
            if directory:
                shutil.rmtree(directory, ignore_errors=True)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            cadence = self.cadence
            if cadence is None:
                return
            if cadence.due(state.global_step) and not self.off:  # due() on every rank: it may agree on N
                start = time.perf_counter()
                self.off = not save_state(args, state, kwargs.get("model"), kwargs.get("optimizer"),
                                          kwargs.get("lr_scheduler"))
                cadence.saved(time.perf_counter() - start)
            cadence.resume()

    TorchrunSnapshots.__name__ = TorchrunSnapshots.__qualname__ = CALLBACK_NAME
    return TorchrunSnapshots


def save_state(args: Any, state: Any, model: Any, optimizer: Any, scheduler: Any) -> bool:
    """Whether snapshots go on: never raises into the training."""
    dropped = Dropped()
    try:
        if model is None or optimizer is None:
            raise ValueError("the trainer passed no model or optimizer to its callbacks")
        text = json.dumps(dataclasses.asdict(state), indent=2, sort_keys=True) + "\n"  # as save_to_json writes
        held = {
            "format": FORMAT,
            "model": plain(model.state_dict(), "model", dropped),
            "optimizer": plain(optimizer.state_dict(), "optimizer", dropped),
            "scheduler": plain(scheduler.state_dict(), "scheduler", dropped) if hasattr(scheduler, "state_dict")
            else None,
            "rng": rng_state(_distributed(args)),
            "trainer_state": text_tensor(text),
        }
        if dropped:
            say("left out of HF Trainer's snapshots (no tensor or plain value): %s" % ", ".join(dropped[:5]),
                once="hf dropped")
        return snapshot.save(int(state.global_step), held)
    except Exception as e:  # a snapshot never stops the training
        say("rank %d: HF Trainer's snapshots are off: %s: %s" % (rank(), type(e).__name__, e), once="hf off",
            everyone=True)
        return False


def write_checkpoint(directory: str, held: dict, args: Any) -> None:
    """An HF checkpoint directory from a snapshot: the files HF's resume reads.

    torch.save writes our own state, verified by its digest at load, for HF's loader (which
    reads it with ``weights_only=True``); nothing here unpickles anything."""
    import torch
    from transformers import trainer as hf

    torch.save(held["model"], os.path.join(directory, hf.WEIGHTS_NAME))
    if held.get("scheduler") is not None:  # HF loads the optimizer only beside a scheduler
        torch.save(held["optimizer"], os.path.join(directory, hf.OPTIMIZER_NAME))
        torch.save(held["scheduler"], os.path.join(directory, hf.SCHEDULER_NAME))
    world = int(getattr(args, "world_size", 1) or 1)
    name = "rng_state_%d.pth" % args.process_index if world > 1 else "rng_state.pth"
    torch.save(rng_values(held["rng"]), os.path.join(directory, name))
    with open(os.path.join(directory, hf.TRAINER_STATE_NAME), "w", encoding="utf-8") as f:
        f.write(tensor_text(held["trainer_state"]))


def wrap_train(trainer: Any) -> None:
    train = trainer.train
    if getattr(train, "_torchrun_snapshots", False):
        return

    @functools.wraps(train)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        _tell_callbacks(self)
        asked = kwargs["resume_from_checkpoint"] if "resume_from_checkpoint" in kwargs else (args[0] if args
                                                                                             else None)
        resumed = None if asked or not _may_resume(self) else load_for(self)
        if resumed is None:
            return train(self, *args, **kwargs)
        step, held = resumed
        directory = resume_dir("hf")
        try:
            write_checkpoint(directory, owned(held), self.args)
            del resumed, held  # HF reads it from the directory: the snapshot's copy goes now, not with train()
            for callback in _ours(self):
                callback.resume_dir = directory  # removed at the first step: HF has read all of it by then
            if args:
                args = (directory,) + args[1:]
            else:
                kwargs["resume_from_checkpoint"] = directory
            say("HF Trainer resumes at step %d from the snapshot through its own resume path (model, optimizer, "
                "scheduler, RNG, data position)" % step)
            return train(self, *args, **kwargs)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    wrapped._torchrun_snapshots = True  # type: ignore[attr-defined]
    trainer.train = wrapped


def _ours(trainer: Any) -> list:
    callbacks = getattr(getattr(trainer, "callback_handler", None), "callbacks", [])
    return [c for c in callbacks if type(c).__name__ == CALLBACK_NAME]


def _tell_callbacks(trainer: Any) -> None:
    """Our callback sees the arguments only: an FSDP that accelerate's config turned on is the trainer's."""
    why = sharded_by(getattr(trainer, "args", None), trainer)
    for callback in _ours(trainer):
        callback.sharded = why


def _may_resume(trainer: Any) -> bool:
    if not _ours(trainer):
        return False  # the user removed it
    if sharded_by(getattr(trainer, "args", None), trainer):
        return False
    return first_load()


def load_for(trainer: Any) -> Optional[Tuple[int, dict]]:
    """The gang's snapshot, where every rank finds it fits this trainer's model; else None, said why."""
    return load_fitting("HF Trainer", trainer.model, unfit, once="hf load")


def unfit(held: Any, model: Any) -> Optional[str]:
    """Why a snapshot does not fit this model (another training's, an older layout); None if it does."""
    if not isinstance(held, dict) or held.get("format") != FORMAT:
        return "not an HF Trainer's snapshot of this version"
    saved = held.get("model")
    if not isinstance(saved, dict):
        return "it holds no model"
    mine = model.state_dict()
    if set(saved) != set(mine):
        return "its model's parameters are named otherwise"
    for name, tensor in mine.items():
        other = saved[name]
        if getattr(other, "shape", None) != tensor.shape or getattr(other, "dtype", None) != tensor.dtype:
            return "%s is %s %s here, %s %s in it" % (name, tuple(tensor.shape), tensor.dtype,
                                                      tuple(getattr(other, "shape", ())), getattr(other, "dtype", "?"))
    return None
