"""This node's failure in a call (``NodeFailure``): its ranks' failures read from what they left, reported
to the gang once per start of the ranks (as a restart is asked for, or as the call ends), the gang's
verdict waited for, and what the failure screen shows gathered into the ``CallOutcome`` from which
``call_error.py`` chooses the error.
"""

from __future__ import annotations

import dataclasses
import socket
from typing import List, Optional

from ..cause import CONTROL_GONE, Cause
from ..gang.client import GangClient
from ..gang.messages import NodeReport
from ..launch import CallPlan
from ..procs import functions
from ..procs.failures import RankFailure, merge_failures, read_agent_failures, read_failures
from . import node_report
from .call_error import CallOutcome, failing_rank, own_rank_failed
from .call_launch import NodeLaunch, RanksStart
from .call_stacks import CallStacks
from .preflight import JobDeadlines
from .ranks_run import RanksRun
from .session import GangSession


class NodeFailure:
    """What this node knows of its ranks' failure in the current start, and whether the gang has it."""

    def __init__(self, session: GangSession, client: GangClient, plan: CallPlan, index: int, launch: NodeLaunch,
                 ranks: RanksRun, stacks: CallStacks, deadlines: Optional[JobDeadlines]) -> None:
        self.session = session
        self.client = client
        self.plan = plan
        self.index = index
        self.launch = launch
        self.ranks = ranks  # read: when the latest start began, for the report
        self.stacks = stacks
        self.deadlines = deadlines
        self.failures: List[RankFailure] = []  # this node's failed ranks in the current start
        self.reported = False  # the current start's failure is the gang's already (a restart was asked for)

    @property
    def node_index(self) -> int:
        return self.session.context.node_index

    def new_start(self) -> None:
        """A restart began: the replaced ranks' failures are not this start's."""
        self.failures, self.reported = [], False

    def report_own(self, start: RanksStart, exit_code: Optional[int]) -> None:
        """This start's failure to the gang, which decides on a restart."""
        self.failures = self._read()
        self._send(self.own_cause(exit_code), start.restart)
        self.reported = True

    def outcome(self, start: RanksStart, exit_code: Optional[int]) -> CallOutcome:
        """The gang's verdict heard (this node's own failure reported first), what the failure screen
        shows gathered: the outcome ``call_error`` chooses the error from."""
        client = self.client
        self.stacks.share(client, self.index, entered=True)
        sent = False
        if exit_code != 0:
            self.failures = self.failures if self.reported else self._read()
            if client.cause is None:
                if not self.reported:
                    self._send(self.own_cause(exit_code), start.restart)
                sent = True
                client.wait_for_verdict(self.session.config.secondary_grace + 2.0)
        cause = client.cause or self.own_cause(exit_code)
        if not sent and client.cause is not None and client.cause.kind not in CONTROL_GONE:
            # Stopped by the gang: the service keeps only the report, for the control's card and record.
            self._send(client.cause, start.restart)
        self.stacks.gather(client, self.index, self.node_index)
        return self._gathered(cause, start, exit_code)

    def _gathered(self, cause: Cause, start: RanksStart, exit_code: Optional[int]) -> CallOutcome:
        """What the failure screen shows: a local run's nodes share the control's log, so only the
        control's error says where (unless the control is gone)."""
        client, topology, log_dir = self.client, self.session.context.topology, self.launch.log_dir
        speaks = self.session.context.is_control or not topology.is_local or cause.kind in CONTROL_GONE
        ran = speaks and node_report.any_rank_ran(self.launch.workdir, self.failures, client, self.index)
        logs = node_report.logs_line(self.session, log_dir, ran) if speaks else ""
        where, suspects = (self.stacks.stacks, self.stacks.suspects(client, cause)) if speaks else ({}, [])
        elsewhere = node_report.failed_elsewhere(client, self.index, self.node_index) if speaks else []
        if suspects and self.stacks.culprits is not None:  # a suspect is not an echo of itself
            elsewhere = sorted(set(elsewhere) - {s.rank for s in self.stacks.culprits.suspects})
        outcome = CallOutcome(self.node_index, cause, exit_code, tuple(self.failures), start.argv,
                              same_log=topology.is_local, host=socket.gethostname(), stacks=where, logs=logs,
                              elsewhere=tuple(elsewhere), suspects=tuple(suspects), started=ran or not speaks,
                              sees_gang=client.speaks_for_gang)
        if own_rank_failed(outcome) and self.plan.function is not None:
            rank = failing_rank(self.failures)
            exc = functions.read_exception(self.launch.workdir, rank) if rank is not None else None
            if exc is not None and rank is not None:
                return dataclasses.replace(outcome, rank_exception=functions.with_rank(exc, rank))
        return outcome

    def own_cause(self, exit_code: Optional[int]) -> Cause:
        cause = node_report.own_cause(self.node_index, self.index, exit_code, self.failures)
        return self.deadlines.own_cause(cause) if self.deadlines is not None else cause

    def report(self) -> NodeReport:
        """What this node tells the control of its ranks as the call ends (their failures where known)."""
        return node_report.report(self.launch.workdir, self.launch.log_dir, self.failures, self.ranks.started_at)

    def _send(self, cause: Cause, restart: int) -> None:
        """To the gang, with its start of the ranks (not taken for a restart's ranks)."""
        self.client.report_failure(cause, call=self.index, report=self.report(), restart=restart)

    def _read(self) -> List[RankFailure]:
        workdir, log_dir = self.launch.workdir, self.launch.log_dir
        found = merge_failures(read_failures(workdir), read_agent_failures(workdir, self.node_index))
        return [node_report.completed(node_report.named(f), log_dir) for f in found]
