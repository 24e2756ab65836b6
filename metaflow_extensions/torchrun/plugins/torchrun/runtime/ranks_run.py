"""One start of this node's ranks, run to its end under the gang's watch (``RanksRun.run``): torchrun's
agent under a ``Supervisor``, stopped when the gang stops, when the gang restarts the ranks, or when the
preflight job's own deadline passes; the ranks' heartbeats and progress carried to the gang meanwhile, and
where the ranks were collected before a stop that is not a restart's.
"""

from __future__ import annotations

import os
import time
from typing import Optional

from ..cause import CauseKind
from ..errors import FULL_REPORT
from ..gang.client import GangClient
from ..gang.gang_progress import ProgressTracker
from ..host.console import say
from ..host.gpu_usage import GpuUsage
from ..procs import stacks
from .call_launch import NodeLaunch, RanksStart
from .call_stacks import CallStacks
from .live_card import LiveCard
from .preflight import JobDeadlines
from .restarts import CallRestarts
from .session import GangSession
from .stop import GangStop
from .supervisor import GracefulStop, StopReason, Supervisor


class RanksRun:
    """Each start of one call's ranks on this node, one at a time; it keeps the latest start's
    supervisor (its times are the call's record) and the first start's times."""

    def __init__(self, session: GangSession, client: GangClient, index: int, launch: NodeLaunch,
                 restarts: CallRestarts, stacks: CallStacks, deadlines: Optional[JobDeadlines]) -> None:
        self.session = session
        self.client = client
        self.index = index
        self.launch = launch
        self.restarts = restarts  # read: which start runs; told when a restart's ranks started
        self.stacks = stacks  # where the ranks were, collected before a stop
        self.deadlines = deadlines  # the preflight job's own; None: a user's call
        self.supervisor: Optional[Supervisor] = None  # the latest start's
        self.first_started: Optional[float] = None  # epoch: the first start's agent
        self.first_output: Optional[float] = None  # epoch: the first start's first line (a restart's: its record)
        self._restart_heard = False  # the latest start is stopped for the gang's restart: no stacks

    @property
    def started_at(self) -> Optional[float]:
        return self.supervisor.started_at if self.supervisor is not None else None

    @property
    def ended_at(self) -> Optional[float]:
        return self.supervisor.ended_at if self.supervisor is not None else None

    @property
    def first_output_at(self) -> Optional[float]:
        """The first start's first line, else the latest start's (none yet where the first was sat out)."""
        return self.first_output or (self.supervisor.first_output if self.supervisor is not None else None)

    @property
    def prunes(self) -> bool:
        """Whether this node prunes the host's other runs: a local run's nodes share the control's host
        (each scan reads every run's directory there: 0.03 CPU-s at 3,800 runs)."""
        return self.session.context.is_control or not self.session.context.topology.is_local

    def run(self, start: RanksStart) -> int:
        """torchrun's exit code on this node for ``start``; told to stop (SIGTERM, Ctrl-C, @timeout),
        where the ranks were goes to the log and the exception goes on up."""
        self._restart_heard = False
        try:
            return self._supervised(start)
        except BaseException:
            self.stacks.share(self.client, self.index, entered=True)
            if self.stacks.stacks:
                say(stacks.summarize(self.stacks.stacks, full=FULL_REPORT))
            raise

    def _supervised(self, start: RanksStart) -> int:
        client, grace, launch = self.client, self.session.context.defaults.shutdown_grace, self.launch
        # Told to stop, this node waits for the gang's verdict, or a restart that goes on without it.
        answer = lambda s: client.news.wait_for_restart_or_verdict(self.index, self.restarts.restart, s)  # noqa: E731
        gang_stop = GangStop(self.session.context.node_index, self.index, grace,
                             report=lambda cause: client.report_failure(cause, call=self.index,
                                                                        restart=self.restarts.restart),
                             verdict=lambda: client.cause, wait_verdict=answer)
        live = LiveCard(client, self.session.context.card.refresh)

        def should_stop() -> Optional[StopReason]:
            live.tick()
            launch.snapshots.follow()
            return gang_stop.check() or self._deadline_passed() or self._restart_due()

        with Supervisor(list(start.argv), env=start.env, shutdown_grace=grace,
                        also_under=lambda: launch.warm.pids if launch.warm else (),
                        before_stop=self._before_stop, on_told=gang_stop.told) as sup, \
                GpuUsage(os.environ, every=client.config.progress_send) as gpus:  # asked as often as it is sent
            self.supervisor = sup
            self.first_started = self.first_started or sup.started_at
            self.restarts.started(sup.started_at)
            assert launch.files is not None  # prepare() made them
            if self.prunes:
                launch.files.prune()  # other runs' logs: while torchrun imports torch, off the critical path
            quiet = lambda: None if sup.last_output is None else time.monotonic() - sup.last_output  # noqa: E731
            with client.watching(quiet, ProgressTracker(launch.workdir, gpu=gpus.latest).sample,
                                 launch.snapshots.saved_in):
                exit_code = sup.wait(should_stop=should_stop)
                self.first_output = self.first_output or sup.first_output
        return exit_code

    def _deadline_passed(self) -> Optional[StopReason]:
        return self.deadlines.stop_reason(self.launch.workdir) if self.deadlines is not None else None

    def _restart_due(self) -> Optional[StopReason]:
        decided = self.client.news.restart_after(self.index, self.restarts.restart)
        if decided is None:
            return None
        self._restart_heard = True  # no stacks: the ranks start again at once
        cause = decided.cause
        if cause.kind is CauseKind.PREEMPTED and cause.grace is not None:
            # A node told to go, which the gang goes on without: every rank gets its grace, as in the gang's
            # stop, so a collective save in the ranks' SIGTERM handler can finish.
            return GracefulStop("the gang restarts the ranks without node %s, told to go" % cause.node_index,
                                cause.grace)
        return "the gang restarts the ranks"

    def _before_stop(self) -> None:
        """Before a fast stop, ranks alive: where they were, unless the gang restarts them."""
        if not self._restart_heard:
            self.stacks.collect(self.client, self.index, self.supervisor, self.launch.workdir)
