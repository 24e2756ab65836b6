"""Each start of a call's ranks on this node, until one ends for good (``RestartLoop``): after a start
ends, the gang is asked whether it restarts them (this node's own failure reported first while restarts
are left; a benched node waits for a restart that brings it in), and each restart or swap the gang
decides is applied in one place, ``RestartLoop.apply``, which makes the next start.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from ..cause import CauseKind
from ..gang import messages as msg
from ..gang.client import GangClient
from ..host.console import say
from ..launch import CallPlan
from ..procs.failures import clear_round
from ..procs.rank_progress import ProgressReport, read_progress
from ..record.result import read_rank_records
from .call_failure import NodeFailure
from .call_launch import NodeLaunch, RanksStart, swap_line
from .preflight import JobDeadlines
from .ranks_run import RanksRun
from .restarts import CallRestarts, Pace
from .session import GangSession


# The causes of a node the gang goes on without (gang/recovery.py): a shrink's line says the gang's new size.
GOES_ON_WITHOUT = (CauseKind.NODE_LOST, CauseKind.UNRESPONSIVE, CauseKind.PREEMPTED)


class RestartLoop:
    """The call's starts of the ranks on this node: the current one, and torchrun's exit code for it."""

    def __init__(self, session: GangSession, client: GangClient, plan: CallPlan, index: int, launch: NodeLaunch,
                 ranks: RanksRun, restarts: CallRestarts, failure: NodeFailure,
                 deadlines: Optional[JobDeadlines]) -> None:
        self.session = session
        self.client = client
        self.plan = plan
        self.index = index
        self.launch = launch
        self.ranks = ranks
        self.restarts = restarts  # which start runs, and each restart so far
        self.failure = failure  # told of each new start; reports this node's failure when asked
        self.deadlines = deadlines
        self.start: Optional[RanksStart] = None  # the current start (None until the first)
        self.exit_code: Optional[int] = None  # torchrun's on this node for the current start (None: not run)
        self.departed = False  # told to go, the gang went on without this node: its call ends, its step goes on

    def run(self, first: RanksStart) -> RanksStart:
        """From ``first`` to the start that ends for good, which it returns."""
        if self.deadlines is not None:
            self.deadlines.went()
        start = self.start = first
        while True:
            decided = self._after(start)
            if decided is None:
                return start
            start = self.start = self.apply(decided)

    def _after(self, start: RanksStart) -> Optional[msg.Restart]:
        """``start`` run (or sat out), the gang's restart after it, if any."""
        if start.benched:  # a spare, or taken out: no ranks here until a restart brings it in
            return None if self.departed else self.client.news.sit_out(self.index, self.restarts.restart)
        self.exit_code = exit_code = self.ranks.run(start)
        if start.restart:
            self.restarts.resumed(self.launch.snapshots.resumed())
            self.restarts.trained(self.launch.snapshots.trained_at())
            behind = slowest(self.launch.workdir, start.restart)
            self.restarts.reported_from(behind.first if behind is not None else None)
        return self.restarts.decided(self.client, self.index, self.session.context.defaults.restarts, exit_code,
                                     lambda: self.failure.report_own(start, exit_code),
                                     self.session.config.secondary_grace + 2.0)

    def apply(self, decided: msg.Restart) -> RanksStart:
        """The one place a restart or swap the gang decided is applied (this node's old ranks are gone):
        the restart recorded, the replaced ranks' records cleared, and the next start made with its seat
        and rendezvous port; what a restart resumes from would be told to the ranks here."""
        ranks, client = self.ranks, self.client
        self.restarts.begin(decided, ranks.started_at, ranks.ended_at, self.launch.rank_starts(self.restarts.restart),
                            read_rank_records(self.launch.workdir, self.failure.failures), self.launch.log_dir,
                            *reported(self.launch.workdir, self.restarts.restart))
        clear_round(self.launch.workdir)
        self.failure.new_start()
        self.exit_code = None
        pinned = self.plan.rdzv_port  # the same port for every start, where the call pinned it
        port = decided.rdzv_port if pinned is None else pinned
        if self.session.context.is_control:
            say(self.restart_line(decided))
        seat = client.seats.get((decided.index, decided.restart))
        node = self.session.context.node_index
        self.departed = decided.cause.kind is CauseKind.PREEMPTED and decided.cause.node_index == node and \
            seat is not None and seat.node_rank is None
        if self.departed:
            say("call %d: node %d was told to stop and the gang goes on without it: its ranks are stopped, and its "
                "step goes on without them" % (self.index + 1, node))
        return self.launch.start(seat, port, decided.restart)

    def restart_line(self, decided: msg.Restart) -> str:
        """The console's one line for the control: a swap's, or every node's ranks restarted."""
        allowed = self.session.context.defaults.restarts
        if decided.swapped_in is not None:
            return swap_line(self.index, decided, allowed, self.client.hosts())
        if decided.cause.kind in GOES_ON_WITHOUT + (CauseKind.REGROWN,):
            nodes = decided.bench.active_count(self.session.context.topology.num_nodes)
            nproc = self.plan.nproc
            world = "world size %d, " % (nodes * nproc) if isinstance(nproc, int) else ""
            return ("call %d: %s (%srestart %d of %d)"
                    % (self.index + 1, decided.cause.summary, world, decided.restart, allowed))
        return ("call %d: restarting every node's ranks (restart %d of %d): %s"
                % (self.index + 1, decided.restart, allowed, decided.cause.summary))


def reported(workdir: str, start: int) -> Tuple[Optional[int], Optional[Pace]]:
    """The newest step this node's ranks of ``start`` reported (steps lost count to it), and the pace of the
    slowest of them: its first report of the start and its latest (none: they reported none)."""
    reports = _reports(workdir, start)
    behind = _behind(reports)
    if behind is None:
        return None, None
    return max(p.step for p in reports), (behind.first, (behind.step, behind.time))


def slowest(workdir: str, start: int) -> Optional[ProgressReport]:
    """The latest report of this node's rank of ``start`` that is furthest behind (None: none reported)."""
    return _behind(_reports(workdir, start))


def _reports(workdir: str, start: int) -> List[ProgressReport]:
    return [p for p in read_progress(workdir).values() if p.start == start] if workdir else []


def _behind(reports: List[ProgressReport]) -> Optional[ProgressReport]:
    return min(reports, key=lambda p: (p.step, p.rank), default=None)
