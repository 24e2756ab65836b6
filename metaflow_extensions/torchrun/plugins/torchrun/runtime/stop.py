"""A stop is the gang's (docs/design.md): a node told to stop (SIGTERM, Ctrl-C,
``@timeout``, a spot notice) reports a ``PREEMPTED`` cause and every node stops its
ranks with the same grace; without a verdict within ``VERDICT_WAIT``, its own anyway.
"""

from __future__ import annotations

import datetime
import time
from typing import Callable, Optional

from ..cause import Cause, CauseKind
from .supervisor import GracefulStop, StopReason
from ..base import timeouts

# What the platforms' SIGTERM stands for, in the one line a user reads.
_WHY = {
    "SIGTERM": "SIGTERM: a stopped job, a cancelled run, a deleted pod",
    "SIGINT": "Ctrl-C",
    "KeyboardInterrupt": "Ctrl-C",
    "TimeoutException": "the step's @timeout",
    "SystemExit": "the task exiting",
}


def read_notice(path: Optional[str]) -> Optional[str]:
    """The termination time Metaflow's spot monitor wrote (ISO 8601), or None.
    An empty file is no notice yet: the monitor truncates, then writes."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            text = f.read(200).decode("utf-8", "replace").strip()
    except OSError:
        return None
    return text or None


def seconds_left(termination_time: str, now: Optional[float] = None) -> Optional[float]:
    """Seconds from ``now`` to the notice's termination time; None when the
    text is not a time (the notice still stops the gang, with the full grace)."""
    try:
        when = datetime.datetime.fromisoformat(termination_time.strip())
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp() - (time.time() if now is None else now)


def grace_for(shutdown_grace: float, notice: Optional[str], now: Optional[float] = None) -> float:
    """``shutdown_grace``, capped by the time a spot notice leaves (less
    ``SPOT_MARGIN``): the instance goes at its termination time, saved or not."""
    left = seconds_left(notice, now) if notice is not None else None
    return shutdown_grace if left is None else max(0.0, min(shutdown_grace, left - timeouts.SPOT_MARGIN))


def preempted(node: int, what: str, grace: float, shutdown_grace: float, notice: Optional[str] = None,
              call: Optional[int] = None) -> Cause:
    """The gang's cause: ``node`` told to stop by ``what`` (a signal's or exception's name) or a spot ``notice``."""
    if notice is not None:
        told = "node %d got a spot termination notice (the instance terminates at %s)" % (node, notice)
    else:
        told = "node %d was told to stop (%s)" % (node, _WHY.get(what, what))
    capped = "" if grace >= shutdown_grace else ", capped by the time left before the termination"
    summary = ("%s while torchrun was running: every node's ranks got SIGTERM at once and up to %g s "
               "(shutdown_grace=%g%s) to save and exit, before SIGKILL" % (told, grace, shutdown_grace, capped))
    return Cause(CauseKind.PREEMPTED, summary, node_index=node, exc_type=None if notice else what,
                 message=notice, grace=grace, call=call)


def notice_path() -> Optional[str]:
    """``current.spot_termination_notice``: set by ``@kubernetes`` and ``@batch``."""
    try:
        from metaflow import current

        path = getattr(current, "spot_termination_notice", None)
    except Exception:
        return None
    return path if isinstance(path, str) and path else None


class GangStop:
    """One call's side of a gang-wide stop: tells the gang, and says how the job stops."""

    def __init__(self, node: int, call: int, shutdown_grace: float, report: Callable[[Cause], None],
                 verdict: Callable[[], Optional[Cause]], wait_verdict: Callable[[float], object],
                 notice: Optional[str] = None):
        """``verdict``: the gang's cause so far; ``notice``: the spot notice file."""
        self.node = node
        self.call = call
        self.shutdown_grace = shutdown_grace
        self._report = report
        self._verdict = verdict
        self._wait_verdict = wait_verdict
        self.notice = notice or notice_path()
        self.own: Optional[Cause] = None
        self._told_at = 0.0
        self._next_look = 0.0

    def told(self, what: str, notice: Optional[str] = None) -> None:
        """The gang hears it first; this node waits (briefly) to be told back, with the others."""
        if self.own is not None:
            return
        grace = grace_for(self.shutdown_grace, notice)
        self.own = preempted(self.node, what, grace, self.shutdown_grace, notice, self.call)
        self._told_at = time.monotonic()
        if self._verdict() is None:
            self._report(self.own)
            self._wait_verdict(timeouts.VERDICT_WAIT)

    def check(self) -> Optional[StopReason]:
        """How the job stops, if it does: asked on every tick of the call's wait."""
        cause = self._verdict()
        if cause is None and self.own is None and self.notice is not None:
            now = time.monotonic()
            if now >= self._next_look:
                self._next_look = now + timeouts.NOTICE_POLL
                notice = read_notice(self.notice)
                if notice is not None:
                    self.told("spot", notice)
                    cause = self._verdict()
        if cause is not None:
            if cause.kind is CauseKind.PREEMPTED:
                return GracefulStop(cause.summary, self.shutdown_grace if cause.grace is None else cause.grace)
            return cause.summary
        if self.own is not None and time.monotonic() - self._told_at >= timeouts.VERDICT_WAIT:
            assert self.own.grace is not None
            return GracefulStop(self.own.summary, self.own.grace)  # no verdict: the control is gone
        return None
