"""Whether the warm process (zygote.py) may still fork: checked before every fork.

Why: a fork copies the calling thread only. A child forked while CUDA is
initialised in the parent inherits a context it cannot use (CUDA's own rule:
"Cannot re-initialize CUDA in forked subprocess"); one forked while a process
group exists inherits its sockets and communicators (NCCL's), used by two
processes at once; one forked while another thread holds a lock (an OpenMP
pool, a library's worker, a thread a user's import hook started) may wait on
it forever. The zygote itself never initialises CUDA or a process group and
starts no thread; whatever else brought one in (a ``sitecustomize``, a ``.pth``
hook, a library imported with torch) makes the fork unsafe, so the zygote
refuses it and the rank starts fresh, as it would without a zygote.

Threads are counted in ``/proc/self/task``: native threads (OpenMP, NCCL's,
CUDA's) do not show in ``threading``. The threads the zygote's own imports
started are its own (OpenBLAS's pool, which numpy starts as it loads, stops
and restarts itself around a fork): those alive once torch is imported
(``warmed``) are the baseline; any other, then or later, refuses the fork.
Pure reads of this process, no torch import: ``torch.cuda.is_initialized()``
only where torch is imported already (it never initialises CUDA).
"""

from __future__ import annotations

import os
import threading
from typing import Any, FrozenSet, Mapping, Optional

_TASKS = "/proc/self/task"


def tasks() -> FrozenSet[int]:
    """The ids of this process's threads (an empty set where /proc says nothing)."""
    try:
        return frozenset(int(t) for t in os.listdir(_TASKS) if t.isdigit())
    except OSError:
        return frozenset()


class ForkGuard:
    """Made as the zygote starts, told when its imports are done (``warmed``),
    asked before each fork (``hazard``)."""

    def __init__(self, inherited: bool = False) -> None:
        """``inherited``: this process was forked from another warm process (a
        local node's, from the host's). Its threads at start are then the ones
        the parent's libraries' fork handlers re-created in it (OpenBLAS
        restarts its pool in the child: 15 threads on a 16-core GPU node, which
        refused every fork there), not a start-up hook's: the parent checked its
        own start. They count as its own once it is warmed."""
        self.at_start = frozenset() if inherited else tasks()
        self.own: Optional[FrozenSet[int]] = None

    def warmed(self) -> None:
        self.own = tasks()

    def hazard(self, modules: Mapping[str, Any]) -> Optional[str]:
        """Why a fork now would not be safe (None: it is). ``modules``: this
        process's ``sys.modules``."""
        if len(self.at_start) > 1:
            return ("%d threads were running before the warm process imported anything "
                    "(a sitecustomize or .pth hook started them)" % (len(self.at_start) - 1))
        why = _cuda_or_group(modules)
        if why is not None:
            return why
        others = [t for t in threading.enumerate() if t is not threading.main_thread()]
        if others:
            return "Python threads are running in the warm process: %s" % ", ".join(
                sorted(t.name for t in others)[:4])
        now = tasks()
        foreign = now - (self.own if self.own is not None else self.at_start)
        if foreign:
            return "%d native threads started since the warm process imported torch (%d in all)" % (
                len(foreign), len(now))
        return None


def _cuda_or_group(modules: Mapping[str, Any]) -> Optional[str]:
    torch = modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    try:
        if cuda is not None and cuda.is_initialized():
            return "CUDA is initialized in the warm process"
    except Exception as e:  # a torch whose check fails: not known to be safe
        return "torch.cuda.is_initialized() failed: %s" % e
    dist = modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return "a torch.distributed process group (its sockets, NCCL's communicators) exists in the warm process"
    except Exception as e:
        return "torch.distributed.is_initialized() failed: %s" % e
    return None
