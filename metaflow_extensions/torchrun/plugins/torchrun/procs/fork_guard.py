"""Whether the warm process (zygote.py) may still fork: checked before every fork.

A child forked after CUDA or a process group came up inherits what it cannot
use, and one forked while another thread holds a lock may wait forever. Native
threads do not show in ``threading``: they are counted in ``/proc/self/task``.
"""

from __future__ import annotations

import os
import threading

TYPE_CHECKING = False  # typing unimported: a zygote's stand-in loads this (handoff.py)
if TYPE_CHECKING:
    from typing import Any, FrozenSet, Mapping, Optional

_TASKS = "/proc/self/task"


def tasks() -> FrozenSet[int]:
    try:
        return frozenset(int(t) for t in os.listdir(_TASKS) if t.isdigit())
    except OSError:
        return frozenset()


class ForkGuard:
    def __init__(self, inherited: bool = False) -> None:
        """``inherited``: forked from another warm process, whose libraries' fork
        handlers re-created their threads here (OpenBLAS: 15 on a 16-core node):
        not a start-up hook's, and its own once warmed."""
        self.at_start = frozenset() if inherited else tasks()
        self.own: Optional[FrozenSet[int]] = None

    def warmed(self) -> None:
        self.own = tasks()

    def hazard(self, modules: Mapping[str, Any]) -> Optional[str]:
        """Why a fork now would not be safe (None: it is)."""
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
