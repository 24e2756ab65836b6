"""A call's in-step restarts as this node runs them, one ``record.InStepRestart`` per restart."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

from ..gang import messages as msg
from ..gang.client import GangClient
from ..host.private import open_private
from ..procs.names import rank_log_path
from ..procs.status import RankStatus

from .call_snapshots import Resumed
from ..record.in_step_restarts import InStepRestart, replaced_ranks, start_mark, with_ranks_start


Report = Tuple[int, float]  # a step, and when it was reported (the rank's wall clock)
Pace = Tuple[Report, Report]  # a start's first and latest report


@dataclass
class CallRestarts:
    """Which start of the ranks runs (0: the first; k: the gang's restart k), and each restart so far."""

    restart: int = 0
    records: List[InStepRestart] = field(default_factory=list)
    reported_step: Optional[int] = None  # the newest step the replaced ranks reported (steps lost count to it)
    replaced_pace: Optional[Pace] = None  # the replaced ranks' first and latest report, (step, when)
    spare_source: Optional[int] = None  # a swap's: the node whose copy the spare was told to fetch

    def decided(self, client: GangClient, index: int, allowed: int, exit_code: Optional[int],
                report: Callable[[], None], wait: float) -> Optional[msg.Restart]:
        """The gang's restart of call ``index``, if any; this node's own failure reported
        first (``report``) while restarts are left."""
        decided = client.news.restart_after(index, self.restart)
        if decided is not None or self.restart >= allowed:
            return decided
        if exit_code in (0, None) or client.cause is not None:
            return None
        report()
        return client.news.wait_for_restart_or_verdict(index, self.restart, wait)

    def begin(self, decided: msg.Restart, ran_from: Optional[float], stopped_at: Optional[float],
              rank_starts: List[Optional[float]], ranks: Sequence[RankStatus] = (),
              log_dir: Optional[str] = None, reported_step: Optional[int] = None,
              replaced_pace: Optional[Pace] = None) -> None:
        """Restart ``decided.restart``: this node's old ranks (``ranks``, kept for the card) are gone; their
        log files say where the next start's lines begin."""
        self.records = with_ranks_start(self.records, rank_starts)
        self.records.append(InStepRestart(decided.restart, decided.cause, ran_from=ran_from,
                                          failed_at=decided.cause.time, stopped_at=stopped_at,
                                          swapped_out=decided.swapped_out, swapped_in=decided.swapped_in,
                                          work_from=min((s for s in rank_starts if s is not None), default=None),
                                          ranks=replaced_ranks(ranks)))
        self.restart = decided.restart
        self.spare_source = decided.snapshot_source
        self.reported_step = reported_step
        self.replaced_pace = replaced_pace
        if log_dir:
            mark_logs(log_dir, sorted({r.rank for r in ranks}), decided.restart)

    def resumed(self, resumed: Optional[Resumed]) -> None:
        """The current restart's ranks resumed from a snapshot in memory (None: they did not). After a swap
        every node's record names the node whose copy the spare fetched (the spare's store says it fetched
        one; every other node read its own): the gang resumed at a step only if every rank, the spare's too,
        held it, and the spare holds nothing of its own."""
        if resumed is not None and self.records:
            source = resumed.source_node if resumed.source_node is not None else self.spare_source
            self.records[-1] = dataclasses.replace(
                self.records[-1], resumed_step=resumed.step, steps_lost=resumed.steps_lost(self.reported_step),
                resumed_from=source, resumed_saved_at=resumed.saved_at)

    def reported_from(self, first: Optional[Report]) -> None:
        """The current restart's ranks' first progress report, where they did not resume from memory: the
        step before it is where your own checkpoint put them, so the replaced ranks' work up to that step was
        kept (``kept_until``, from their pace), and their training began with it."""
        last = self.records[-1] if self.records else None
        if first is None or last is None or last.resumed_saved_at is not None:
            return
        kept = kept_until(self.replaced_pace, first[0] - 1)
        self.records[-1] = dataclasses.replace(last, kept_until=kept, trained_at=last.trained_at or first[1])

    def trained(self, at: Optional[float]) -> None:
        """The current restart's ranks committed their first snapshot ``at`` (None: none, or snapshots off)."""
        if at is not None and self.records:
            self.records[-1] = dataclasses.replace(self.records[-1], trained_at=at)

    def started(self, at: Optional[float]) -> None:
        """The current restart's ranks started ``at`` (the first start has no record)."""
        if self.records and self.records[-1].restarted_at is None:
            self.records[-1] = dataclasses.replace(self.records[-1], restarted_at=at)


def kept_until(pace: Optional[Pace], step: int) -> Optional[float]:
    """When the replaced ranks had done ``step``, on the line through their first and latest report (None: not
    known, as from one report short of it)."""
    if pace is None or step < 0:
        return None
    (s0, t0), (s1, t1) = pace
    if step >= s1:
        return t1
    if s1 <= s0:
        return None
    return t1 - (s1 - step) * (t1 - t0) / (s1 - s0)


def mark_logs(log_dir: str, ranks: Sequence[int], restart: int) -> None:
    """One line at the end of each of these ranks' log files: the lines above it are the replaced
    start's (``record/in_step_restarts.split_by_start`` cuts a rank's last lines there)."""
    line = (start_mark(restart) + "\n").encode()
    for rank in ranks:
        for stream in ("stdout", "stderr"):
            try:
                fd = open_private(rank_log_path(log_dir, rank, stream), os.O_WRONLY | os.O_APPEND)
            except OSError:  # none: the rank wrote nothing there
                continue
            try:
                os.write(fd, line)
            except OSError:
                pass
            finally:
                os.close(fd)
