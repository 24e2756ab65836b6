"""A call's in-step restarts on one node (``@torchrun(restarts=N)``), as the
result record and the card count them: like attempts, each with its cause,
what it cost in work, and how long the gang took to run the ranks again.

The service decides a restart (``gang/restarts.py``); the call carries it out
(``runtime/restarts.CallRestarts``: stop the ranks, start a new torchrun on
the fresh rendezvous) and keeps one ``InStepRestart`` per restart. JSON only
in ``to_wire``/``from_wire`` (codec.py), every field read back checked.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, List, Mapping, Optional

from ..cause import Cause, CauseKind
from ..base.codec import Int, Lenient, Real, Via

# A record read back keeps at most this many restarts (restarts= is at most 100).
MAX_RESTARTS_KEPT = 128
# Characters of a restart's cause's message and traceback the record keeps: a
# restart's cause is rarely a Python exception, and 100 of them stay small.
CAUSE_TEXT = 600
# A node's index, as a swap names it.
Node = Annotated[int, Int(0, (1 << 20) - 1)]
Seconds = Annotated[Optional[float], Real(digits=3)]


def _cause(value: Any) -> Cause:
    """Read as cause.py reads a peer's (a bad field dropped); none at all is no restart."""
    cause = Cause.from_wire(value)
    if cause is None:
        raise ValueError("not a cause")
    return cause


def _cause_kept(cause: Cause) -> Any:
    """Its message and traceback's tails only: a restart's cause is rarely a Python exception."""
    return dataclasses.replace(cause, traceback=_tail(cause.traceback, CAUSE_TEXT),
                               message=_tail(cause.message, CAUSE_TEXT)).to_wire()


@dataclass(frozen=True)
class InStepRestart(Lenient):
    """Restart ``restart`` (1, 2, ...) of a call's ranks, on this node; written
    with its cause's kind and summary and what it cost, for the record's readers."""

    WIRE_ORDER = ("restart", "cause", "kind", "stopped", "ran_from", "failed_at", "stopped_at", "restarted_at",
                  "ranks_at", "lost_work_seconds", "restart_seconds", "lost_seconds", "swapped_out", "swapped_in",
                  "work_from")
    restart: Annotated[int, Int(1, (1 << 16) - 1)]
    cause: Annotated[Cause, Via(_cause, _cause_kept)]
    # When the replaced ranks' torchrun started, and when they failed (the
    # cause's time, on the clock of the node that saw it).
    ran_from: Optional[float]
    failed_at: float
    # This node's old ranks all gone; its new torchrun started; the first of
    # its new ranks at the user's script (its status written by the bootstrap).
    stopped_at: Optional[float] = None
    restarted_at: Optional[float] = None
    ranks_at: Optional[float] = None
    # A swap (@torchrun(spares)): the node taken out, and the spare that came in.
    swapped_out: Optional[Node] = None
    swapped_in: Optional[Node] = None
    # The replaced ranks at the user's script (the first of this node's): where
    # their work began, the goodput ledger's mark (the call's first line is its
    # last start's).
    work_from: Optional[float] = None

    @property
    def kind(self) -> CauseKind:
        return self.cause.kind

    @property
    def stopped(self) -> str:
        return self.cause.summary

    @property
    def lost_work_seconds(self) -> Seconds:
        """The replaced ranks' run, from their start at the user's script
        (their torchrun's start where none said it started): the most this
        failure can have lost (less where they saved a checkpoint and the new
        ranks load it). The goodput ledger's ``lost_work`` for it, as it cuts it."""
        start = self.work_from if self.work_from is not None else self.ran_from
        return max(0.0, self.failed_at - start) if start is not None else None

    @property
    def restart_seconds(self) -> Seconds:
        """The failure to this node's new ranks at the user's script (to its
        new torchrun's start where no rank said it started)."""
        back = self.ranks_at if self.ranks_at is not None else self.restarted_at
        return max(0.0, back - self.failed_at) if back is not None else None

    @property
    def lost_seconds(self) -> Seconds:
        parts = [p for p in (self.lost_work_seconds, self.restart_seconds) if p is not None]
        return sum(parts) if parts else None


def swap_words(out: int, came_in: int, hosts: Mapping[int, str]) -> str:
    """A swap as the ledger, the card and the node history name it."""
    return "node %d (%s) out, spare node %d (%s) in" % (out, hosts.get(out) or "?", came_in,
                                                         hosts.get(came_in) or "?")


def read_back(listed: Any) -> List[InStepRestart]:
    """A record's ``in_step_restarts``, each checked; what does not read is left out."""
    found = [InStepRestart.from_wire(item) for item in (listed if isinstance(listed, list) else [])[:MAX_RESTARTS_KEPT]]
    return [r for r in found if r is not None]


def with_ranks_start(restarts: List[InStepRestart], starts: List[Optional[float]]) -> List[InStepRestart]:
    """The latest restart, completed with when its first rank reached the
    user's script (``starts``: the start of each of this node's ranks of that
    restart, read from their status files before the next restart clears them)."""
    if not restarts or restarts[-1].ranks_at is not None:
        return restarts
    known = [s for s in starts if s is not None]
    if not known:
        return restarts
    return restarts[:-1] + [dataclasses.replace(restarts[-1], ranks_at=min(known))]


def _tail(text: Optional[str], limit: int) -> Optional[str]:
    return text if text is None or len(text) <= limit else "[...] " + text[-limit:]

