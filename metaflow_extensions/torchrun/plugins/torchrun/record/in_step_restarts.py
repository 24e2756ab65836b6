"""A call's in-step restarts on one node (``@torchrun(restarts=N)``), counted
like attempts: each with its cause, the work it lost, the time to run again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import re
from typing import Annotated, Any, List, Mapping, Optional, Sequence, Tuple

from ..cause import Cause, CauseKind
from ..base.codec import SKIP, Int, Items, Lenient, Real, Via
from ..gang.messages import CAUSE
from ..procs.status import RankStatus

# Characters of a restart's cause's message and traceback kept: 100 restarts stay small.
CAUSE_TEXT = 600
Node = Annotated[int, Int(0, (1 << 20) - 1)]
Seconds = Annotated[Optional[float], Real(digits=3)]
# A replaced start's ranks on this node kept in its restart's record, for the card's timeline: a node's
# share, bounded (its failed ranks first), so 100 restarts of 8 ranks stay a few tens of KB.
REPLACED_RANKS = 16
# The line written into each rank's log files at a restart, so a rank's last lines say which start
# wrote them (the card splits them there; a rank that prints it itself only mislabels its own lines).
START_MARK = "[metaflow-torchrun] restart %d of this call's ranks: the lines above are start %d's, below start %d's"
_START_MARK = re.compile(r"^\[metaflow-torchrun\] restart (\d{1,6}) of this call's ranks: ")


def _cause_kept(cause: Cause) -> Any:
    """Its message and traceback's tails only: a restart's cause is rarely a Python exception."""
    return dataclasses.replace(cause, traceback=_tail(cause.traceback, CAUSE_TEXT),
                               message=_tail(cause.message, CAUSE_TEXT)).to_wire()


@dataclass(frozen=True)
class InStepRestart(Lenient):
    """Restart ``restart`` (1, 2, ...) of a call's ranks, on this node."""

    WIRE_ORDER = ("restart", "cause", "kind", "stopped", "ran_from", "failed_at", "stopped_at", "restarted_at",
                  "ranks_at", "lost_work_seconds", "restart_seconds", "lost_seconds", "swapped_out", "swapped_in",
                  "work_from", "resumed_step", "steps_lost", "resumed_from", "resumed_saved_at", "kept_until",
                  "trained_at", "ranks")
    restart: Annotated[int, Int(1, (1 << 16) - 1)]
    cause: Annotated[Cause, Via(CAUSE.read, _cause_kept)]  # read as a peer's (none at all: no restart)
    # The replaced ranks' torchrun's start and failure (on its node's clock); this
    # node's old ranks gone, its new torchrun started, its first new rank at the script.
    ran_from: Optional[float]
    failed_at: float
    stopped_at: Optional[float] = None
    restarted_at: Optional[float] = None
    ranks_at: Optional[float] = None
    # A swap (@torchrun(spares)): the node taken out, the spare brought in.
    swapped_out: Optional[Node] = None
    swapped_in: Optional[Node] = None
    # The replaced ranks at the script: where their work began, for the
    # goodput ledger (the call's first line is its last start's).
    work_from: Optional[float] = None
    # Where the new ranks resumed from memory (None: not from a snapshot, so from the user's checkpoint or
    # the start): the step, the steps saved after it and lost, and whose copy: after a swap, on every node,
    # the node whose copy the spare fetched; else None (each node its own).
    resumed_step: Annotated[Optional[int], Int(0, (1 << 53) - 1), SKIP] = None
    steps_lost: Annotated[Optional[int], Int(0, (1 << 53) - 1), SKIP] = None
    resumed_from: Annotated[Optional[int], Int(0, (1 << 20) - 1), SKIP] = None
    resumed_saved_at: Annotated[Optional[float], Real(digits=3), SKIP] = None  # that snapshot saved, this node's clock
    # Not from memory, where the ranks report progress: when the replaced ranks had done the step before the new
    # ranks' first report (the step your checkpoint put them at), on the line of their own reports' pace.
    kept_until: Annotated[Optional[float], Real(digits=3), SKIP] = None
    # The new ranks' first snapshot committed on this node, else their first progress report: where their
    # training is known to have begun.
    trained_at: Annotated[Optional[float], Real(digits=3), SKIP] = None
    # This node's ranks of the start this restart replaced (its start is ``restart - 1``), as they ended.
    ranks: Annotated[Tuple[RankStatus, ...], Items(REPLACED_RANKS), SKIP] = ()

    @property
    def kind(self) -> CauseKind:
        return self.cause.kind

    @property
    def stopped(self) -> str:
        return self.cause.summary

    @property
    def lost_work_seconds(self) -> Seconds:
        """The replaced ranks' run since they reached the script (else their torchrun's start), or, where
        the new ranks resumed from a snapshot in memory, since that snapshot: the work kept is not lost."""
        start = self.work_from if self.work_from is not None else self.ran_from
        kept = self.resumed_saved_at if self.resumed_saved_at is not None else self.kept_until
        if kept is not None:
            start = max(start or 0.0, min(kept, self.failed_at))
        return max(0.0, self.failed_at - start) if start is not None else None

    @property
    def restart_seconds(self) -> Seconds:
        """The failure to the new ranks at the script (else the new torchrun's start)."""
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


def with_ranks_start(restarts: List[InStepRestart], starts: List[Optional[float]]) -> List[InStepRestart]:
    """The latest restart with its first rank's start at the script (from ``starts``)."""
    if not restarts or restarts[-1].ranks_at is not None:
        return restarts
    known = [s for s in starts if s is not None]
    if not known:
        return restarts
    return restarts[:-1] + [dataclasses.replace(restarts[-1], ranks_at=min(known))]


def replaced_ranks(records: Sequence[RankStatus]) -> Tuple[RankStatus, ...]:
    """A replaced start's ranks on this node as its restart keeps them: its failed ranks first, bounded."""
    failed = [r for r in records if r.exit_code not in (0, None)]
    kept = (failed + [r for r in records if r.exit_code in (0, None)])[:REPLACED_RANKS]
    return tuple(sorted((r.for_wire() for r in kept), key=lambda r: r.rank))


def start_mark(restart: int) -> str:
    """The line a restart writes into this node's ranks' log files."""
    return START_MARK % (restart, restart - 1, restart)


def split_by_start(lines: Sequence[str], last_start: int) -> List[Tuple[int, List[str]]]:
    """A rank's last lines cut at the restarts' marks: (start, its lines) in order; those before mark k
    are start k-1's, after it start k's, and without a mark ``last_start``'s."""
    found: List[Tuple[int, List[str]]] = []
    current: List[str] = []
    after: Optional[int] = None  # the start the last mark began
    for line in lines:
        m = _START_MARK.match(line)
        if m is None:
            current.append(line)
            continue
        if current:
            found.append((int(m.group(1)) - 1, current))
        current, after = [], int(m.group(1))
    if current:
        found.append((after if after is not None else last_start, current))
    return found


def _tail(text: Optional[str], limit: int) -> Optional[str]:
    return text if text is None or len(text) <= limit else "[...] " + text[-limit:]

