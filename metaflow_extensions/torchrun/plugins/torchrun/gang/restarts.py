"""The gang's in-step restart (``@torchrun(restarts=N)``): whether a failure
restarts a call's ranks in the same tasks, decided in one place, the service.

Pure bookkeeping over a call's ``CallState``; the service (``server.py``)
sends the decision to every node as one ``Restart`` message, and each node
stops its ranks and starts a new torchrun with a fresh static rendezvous on the
port the decision names (``runtime/call.py``). What may be restarted is
``cause.restartable_in_step``'s, the classification ``retry_on`` uses.
"""

from __future__ import annotations

import threading
import time
from typing import Dict, Optional, Set, Tuple

from ..cause import Cause, restartable_in_step
from ..host import log
from . import messages as msg
from .bench import Seat
from .config import GangConfig
from .calls import CallState

_log = log.get("gang.client")


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


class RestartNews:
    """A node's end (a mixin of ``GangClient``): the restarts it heard of,
    which its call's supervision loop reads."""

    node_index: int
    cause: Optional[Cause]
    _news: threading.Condition
    _closing: threading.Event
    _restarts: Dict[int, msg.Restart]
    _calls_done: Set[int]
    config: GangConfig
    seats: Dict[Tuple[int, int], Seat]

    def _heard_restart(self, message: msg.Restart) -> None:
        seat = message.bench.seat(self.node_index, self.config.num_nodes)
        with self._news:
            self.seats[(message.index, message.restart)] = seat
            known = self._restarts.get(message.index)
            if known is None or message.restart > known.restart:
                self._restarts[message.index] = message
            self._news.notify_all()
        _log.debug("node %d: restart %d of call %d decided (port %d)", self.node_index, message.restart,
                   message.index, message.rdzv_port)

    def restart_after(self, index: int, restart: int) -> Optional[msg.Restart]:
        """The gang's latest restart of call ``index`` if it is later than
        ``restart`` (the start this node's ranks are in), else None."""
        with self._news:
            latest = self._restarts.get(index)
        return latest if latest is not None and latest.restart > restart else None

    def wait_for_restart_or_verdict(self, index: int, restart: int, seconds: float) -> Optional[msg.Restart]:
        """After reporting a failure of call ``index``'s ranks: the service
        restarts them or ends the gang; the restart, or None."""
        deadline = time.monotonic() + seconds
        with self._news:  # woken by the news itself (a restart, a verdict, the close)
            while (self.cause is None and not self._closing.is_set() and time.monotonic() < deadline
                   and self.restart_after(index, restart) is None):
                self._news.wait(max(0.0, min(0.5, deadline - time.monotonic())))
        return self.restart_after(index, restart)

    def sit_out(self, index: int, restart: int) -> Optional[msg.Restart]:
        """A benched node in call ``index`` (its ranks, if it had any, in start
        ``restart``): until a later restart (which may bring it in), the call's
        end (every active node done: None) or the gang's verdict (None)."""
        with self._news:  # woken by the news itself (a restart, the end, a verdict, the close)
            while (self.cause is None and not self._closing.is_set() and index not in self._calls_done
                   and self.restart_after(index, restart) is None):
                self._news.wait(0.5)
        return self.restart_after(index, restart)

    def call_over(self, index: int) -> bool:
        """Every active node finished call ``index`` (told to the control and the benched nodes)."""
        with self._news:
            return index in self._calls_done
