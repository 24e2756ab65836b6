"""A call's in-step restarts as this node runs them, one ``record.InStepRestart`` per restart."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from ..gang import messages as msg
from ..gang.client import GangClient

from ..record.in_step_restarts import InStepRestart, with_ranks_start


@dataclass
class CallRestarts:
    """Which start of the ranks runs (0: the first; k: the gang's restart k), and each restart so far."""

    restart: int = 0
    records: List[InStepRestart] = field(default_factory=list)

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
              rank_starts: List[Optional[float]]) -> None:
        """Restart ``decided.restart``: this node's old ranks are gone."""
        self.records = with_ranks_start(self.records, rank_starts)
        self.records.append(InStepRestart(decided.restart, decided.cause, ran_from=ran_from,
                                          failed_at=decided.cause.time, stopped_at=stopped_at,
                                          swapped_out=decided.swapped_out, swapped_in=decided.swapped_in,
                                          work_from=min((s for s in rank_starts if s is not None), default=None)))
        self.restart = decided.restart

    def started(self, at: Optional[float]) -> None:
        """The current restart's ranks started ``at`` (the first start has no record)."""
        if self.records and self.records[-1].restarted_at is None:
            self.records[-1] = dataclasses.replace(self.records[-1], restarted_at=at)
