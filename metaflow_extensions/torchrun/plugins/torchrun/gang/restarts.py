"""The gang's in-step restart (``@torchrun(restarts=N)``): whether a failure
restarts a call's ranks in the same tasks, decided in one place, the service.

Pure bookkeeping over a call's ``CallState``; the service (``server.py``)
sends the decision to every node as one ``Restart`` message, and each node
stops its ranks and starts a new torchrun with a fresh static rendezvous on the
port the decision names (``runtime/call.py``), having heard it as news of
the call (``client.CallNews``). What may be restarted is
``cause.restartable_in_step``'s, the classification ``retry_on`` uses.
"""

from __future__ import annotations

import time
from typing import Optional

from ..cause import Cause, restartable_in_step
from .calls import CallState


def may_restart(state: Optional[CallState], cause: Cause, allowed: int) -> bool:
    """Restart call ``state`` after ``cause``: restarts are left, every node
    reached the call (its ranks ran), none is done with it (a node that
    finished cannot run its ranks again), and the failure left every task
    alive and was not a Python exception of the user's code."""
    if state is None or state.restart >= allowed or cause.call != state.index:
        return False
    if state.all_entered_at is None or state.done:
        return False
    return restartable_in_step(cause)


def begin(state: CallState, rdzv_port: int, cause: Cause) -> int:
    """Restart ``state``'s ranks: the next restart's index, its rendezvous
    port, and the moment hang detection counts from again."""
    state.restart += 1
    state.rdzv_port = rdzv_port
    state.restarted_at = time.monotonic()
    state.restart_causes.append(cause)
    return state.restart


def stale(state: Optional[CallState], restart: int) -> bool:
    """A failure reported of ranks a restart has already replaced."""
    return state is not None and restart < state.restart
