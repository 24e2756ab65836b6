"""A warm rank's process groups, held until the process ends, so torch never destroys one on the script's thread.

When a script lets go of its last handle on a gloo group (DDP's reducer, freed as ``main()`` returns after
``destroy_process_group``), torch destroys the group there: it joins gloo's worker threads with the GIL
held. A worker still releasing a finished collective (an all-reduce a ``barrier`` waited on) frees that
collective's tensor, which needs the GIL, and both threads wait forever: the rank never exits and its
node's agent waits on it. A rank forked warm ends without running destructors (``zygote.exit_warm``), so a
group held here is never destroyed at all. A cold rank is not changed: Python's own exit would destroy
what is held here, on the same thread, with the GIL.

Only ``init_process_group``'s default group and ``new_group``'s are held, at most ``MAX`` of them: a script
that makes groups in a loop keeps its first ``MAX`` alive, no more.
"""

from __future__ import annotations

import functools
import sys

TYPE_CHECKING = False  # typing unimported: a rank's start loads this
if TYPE_CHECKING:
    from typing import Any, Callable, List

MAX = 64
_HELD: List[Any] = []


def hold(group: Any) -> None:
    if group is not None and len(_HELD) < MAX and not any(g is group for g in _HELD):
        _HELD.append(group)


def _holding_default(init: Callable[..., Any], c10d: Any) -> Callable[..., Any]:
    @functools.wraps(init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = init(*args, **kwargs)
        try:
            hold(c10d._get_default_group())
        except Exception:  # a torch without it, or no group made: nothing to hold
            pass
        return out

    init_process_group.__torchrun_holds__ = True  # type: ignore[attr-defined]
    return init_process_group


def _holding_new(new: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(new)
    def new_group(*args: Any, **kwargs: Any) -> Any:
        group = new(*args, **kwargs)
        hold(group)
        return group

    new_group.__torchrun_holds__ = True  # type: ignore[attr-defined]
    return new_group


def install() -> bool:
    """In a rank whose torch is imported already (forked warm): whether the hold is on."""
    dist = sys.modules.get("torch.distributed")
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if dist is None or c10d is None:
        return False
    init, new = getattr(c10d, "init_process_group", None), getattr(c10d, "new_group", None)
    if init is None or new is None or getattr(init, "__torchrun_holds__", False):
        return False
    held_init, held_new = _holding_default(init, c10d), _holding_new(new)
    modules: List[Any] = [c10d, dist]
    for module in modules:
        if getattr(module, "init_process_group", None) is init:
            module.init_process_group = held_init
        if getattr(module, "new_group", None) is new:
            module.new_group = held_new
    return True
