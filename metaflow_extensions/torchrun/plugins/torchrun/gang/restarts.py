"""The in-step restart (``@torchrun(restarts=N)``), decided in one place, the
service, and sent to every node as one ``Restart``."""

from __future__ import annotations

import time
from typing import Optional

from ..cause import Cause, restartable_in_step
from .calls import CallState


def may_restart(state: Optional[CallState], cause: Cause, allowed: int) -> bool:
    """Restarts are left, every node reached the call and none is done with it (it cannot run its ranks again)."""
    if state is None or state.restart >= allowed or cause.call != state.index:
        return False
    return state.all_entered_at is not None and not state.done and restartable_in_step(cause)


def begin(state: CallState, rdzv_port: int) -> int:
    """The next restart's index; hang detection counts from now."""
    state.restart += 1
    state.rdzv_port = rdzv_port
    state.restarted_at = time.monotonic()
    return state.restart
