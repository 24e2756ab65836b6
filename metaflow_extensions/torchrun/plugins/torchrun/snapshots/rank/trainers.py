"""In-memory snapshots from HF's and Lightning's ``Trainer`` with no change to the user's code.

The bootstrap installs this where the step keeps snapshots (the runtime sets ``SNAPSHOT_ENV``
only then), whatever the progress setting. The import hook that adds the progress callback
(``trainer_hooks``) adds ours too: every N steps (``cadence``) a callback hands the
trainer's state to ``snapshot.save``; on a restart the trainer's own resume path is fed a
checkpoint written from ``snapshot.load``, so the trainer restores what it always restores
(data-loader position included) from the state of a moment ago. ``hf`` and
``lightning`` hold each trainer's part; this module, what they share.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ...procs import trainer_hooks
from ...procs.names import SNAPSHOT_EVERY_ENV, WORK_DIR_ENV
from .cadence import Cadence, every_from_setting

TAG = "TorchrunSnapshots"
_said: set = set()
_loaded: List[bool] = []  # a process resumes one training from a snapshot, its first


def install() -> None:
    from . import hf, lightning

    watched: Dict[str, Callable[[Any], None]] = {trainer_hooks._HF: hf.patch}
    watched.update(dict.fromkeys(trainer_hooks._LIGHTNING, lightning.patch))
    trainer_hooks.after_import(TAG, watched)


def say(text: str, once: Optional[str] = None, everyone: bool = False) -> None:
    """A line on rank 0's stderr (every rank's with ``everyone``), beside ``snapshot``'s own."""
    if once is not None:
        if once in _said:
            return
        _said.add(once)
    if everyone or rank() == 0:
        sys.stderr.write("metaflow-torchrun: snapshot: %s\n" % text)
        sys.stderr.flush()


def rank() -> int:
    dist = _dist()
    if dist is not None:
        return int(dist.get_rank())
    text = os.environ.get("RANK", "0")
    return int(text) if text.isdigit() else 0


def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def gang_max(value: int) -> int:
    """The largest ``value`` of all ranks: every rank calls it at the same point."""
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return value
    import torch

    device = torch.device("cpu")
    if "nccl" in str(dist.get_backend()).lower() and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    row = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(row, op=dist.ReduceOp.MAX)
    return int(row.item())


def new_cadence() -> Optional[Cadence]:
    """The user's N (``@torchrun(snapshots=N)``) or one chosen from a save's cost; None where it is refused."""
    try:
        every = every_from_setting(os.environ.get(SNAPSHOT_EVERY_ENV, ""))
    except ValueError as e:
        say("%s=%s: trainer snapshots are off" % (SNAPSHOT_EVERY_ENV, e), once="every", everyone=True)
        return None
    return Cadence(every, gang_max, say_cadence)


def load_fitting(trainer: str, model: Any, unfit: Callable[[Any, Any], Optional[str]],
                 once: str) -> Optional[Tuple[int, dict]]:
    """The gang's snapshot, where every rank finds it fits ``model`` (``unfit`` says why not); else None,
    said why: ``trainer`` (its name in the line) then starts as asked."""
    from . import api as snapshot  # the rank's start (the bootstrap installs this module) stays light

    try:
        resumed = snapshot.load()
    except Exception as e:  # no process group: the trainer set none up for this run
        say("%s starts as asked, not from a snapshot: %s" % (trainer, e), once=once)
        return None
    if resumed is None:
        return None
    why = unfit(resumed[1], model)
    if gang_max(1 if why else 0):
        say("the snapshot of step %d is not used (%s): %s starts as asked" % (resumed[0], why or "on another rank",
                                                                             trainer))
        return None
    return resumed


def say_cadence(text: str) -> None:
    """The interval chosen, once a run: by the first start (a restart's ranks choose again, silently) and
    once a process (a script that trains twice)."""
    from . import api as snapshot  # the rank's start (the bootstrap installs this module) stays light

    if not snapshot.restarted():
        say(text, once="cadence")


def first_load() -> bool:
    """Whether this process has not yet resumed a training from a snapshot (later ones start as asked)."""
    if _loaded:
        return False
    _loaded.append(True)
    return True


def resume_dir(kind: str) -> str:
    """A private directory for the checkpoint a trainer resumes from, in the call's work directory."""
    parent = os.environ.get(WORK_DIR_ENV) or None
    if parent is not None and not os.path.isdir(parent):
        parent = None
    return tempfile.mkdtemp(prefix="snapshot-%s-rank%d-" % (kind, rank()), dir=parent)


def rng_state(distributed: bool) -> dict:
    """Each generator a training draws from (Python's, numpy's, torch's CPU and CUDA: every device's where
    ``distributed``), as tensors and plain values: what a snapshot holds."""
    import numpy
    import torch

    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = numpy.random.get_state(legacy=True)
    keys = numpy.asarray(keys)
    out = {"python": [version, list(internal), gauss], "cpu": torch.random.get_rng_state(),
           "numpy": {"name": str(name), "keys": torch.from_numpy(keys.astype(numpy.int64)), "pos": int(pos),
                     "has_gauss": int(has_gauss), "cached": float(cached)}}
    if torch.cuda.is_available():
        out["cuda"] = list(torch.cuda.random.get_rng_state_all()) if distributed else \
            torch.cuda.random.get_rng_state()
    return out


def rng_values(held: dict) -> dict:
    """``rng_state``'s value back in each library's own form (HF's ``_load_rng_state`` reads this dict)."""
    import numpy

    version, internal, gauss = held["python"]
    n = held["numpy"]
    out = {"python": (int(version), tuple(int(i) for i in internal), gauss), "cpu": held["cpu"],
           "numpy": (n["name"], n["keys"].numpy().astype(numpy.uint32), n["pos"], n["has_gauss"], n["cached"])}
    if "cuda" in held:
        out["cuda"] = held["cuda"]
    return out


def set_rng(held: dict) -> None:
    """Every generator ``rng_state`` kept, set back (CUDA's where this process has CUDA)."""
    import numpy
    import torch

    values = rng_values(owned(held))  # torch's setters take a tensor of its own, not a view
    random.setstate(values["python"])
    numpy.random.set_state(values["numpy"])
    torch.random.set_rng_state(values["cpu"])
    cuda = values.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if isinstance(cuda, list):
            torch.cuda.random.set_rng_state_all(cuda)
        else:
            torch.cuda.random.set_rng_state(cuda)


class Dropped(List[str]):
    """Where ``plain`` left a value out."""


def plain(value: Any, path: str = "state", dropped: Optional[Dropped] = None) -> Any:
    """``value`` as a snapshot holds it: dicts, lists, tuples, tensors and plain Python values.
    Subclasses (OrderedDict, a str enum, a named tuple) become their base; numpy values their
    Python or list form; anything else is left out (a list keeps None in its place) and named in
    ``dropped``."""
    import torch

    if isinstance(value, torch.Tensor) or value is None or type(value) in (bool, int, float, str, bytes):
        return value
    if isinstance(value, str):
        return str.__str__(value)  # a str enum's value, not its name
    if isinstance(value, (int, float, bytes)):
        return int(value) if isinstance(value, int) else float(value) if isinstance(value, float) else bytes(value)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if isinstance(key, (str, int)) and not isinstance(key, bool):
                key = str(key) if isinstance(key, str) else int(key)
                kept = plain(item, "%s[%r]" % (path, key), dropped)
                if kept is not _DROP:
                    out[key] = kept
            elif dropped is not None:
                dropped.append("%s (a key of type %s)" % (path, type(key).__name__))
        return out
    if isinstance(value, (list, tuple)):
        items = [plain(item, "%s[%d]" % (path, i), dropped) for i, item in enumerate(value)]
        items = [None if item is _DROP else item for item in items]
        return items if isinstance(value, list) else tuple(items)
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return plain(value.tolist(), path, dropped)
    if dropped is not None:
        dropped.append("%s (a %s)" % (path, type(value).__name__))
    return _DROP


_DROP = object()


def text_tensor(text: str) -> Any:
    """Text of any length as a snapshot holds it (one str is kept under 1 MiB)."""
    import torch

    data = bytearray(text.encode("utf-8"))
    return torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def tensor_text(tensor: Any) -> str:
    return bytes(tensor.numpy().tobytes()).decode("utf-8")


def owned(value: Any) -> Any:
    """``value`` with each tensor in memory of its own. A loaded snapshot's tensors are views of one
    buffer: ``torch.save`` would write the whole buffer beside each, and ``torch.set_rng_state``
    crashes the process on a view that does not start its storage (torch 2.13)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: owned(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [owned(item) for item in value]
        return items if isinstance(value, list) else tuple(items)
    return value
