"""One ``current.torch.run`` call on one node, in phases: enter (the control announces
the rendezvous port), prepare, supervise (restarts included), finish (ok or failed), record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..cause import CONTROL_GONE, Cause, CauseKind
from ..errors import FULL_REPORT, GangAborted, TorchrunException, TorchrunFailed, TorchrunInvalidArgument
from ..gang import NodeReport, Seat
from ..gang.client import GangClient
from ..gang.gang_progress import ProgressTracker
from ..host.console import say
from ..host.gpu_usage import GpuUsage
from ..launch import CallPlan
from ..launch.command import argparse_hint
from ..procs.failures import RankFailure, clear_round, merge_failures, read_agent_failures, read_failures
from ..procs import functions, stacks
from ..record.in_step_restarts import with_ranks_start
from ..record.result import GangView, TorchrunResult, read_rank_records
from ..record import what_ran
from ..gang import messages as msg
from . import node_report
from .call_error import CallOutcome, call_error, failing_rank, own_rank_failed
from .preflight import JobDeadlines
from .call_launch import NodeLaunch, swap_line
from .live_card import LiveCard
from .call_stacks import CallStacks
from .restarts import CallRestarts
from .session import GangSession
from .stop import GangStop
from .supervisor import StopReason, Supervisor


@dataclass
class CallRun:
    """One call on this node."""

    session: GangSession
    plan: CallPlan
    index: int
    rdzv_port: Optional[int] = None
    argv: List[str] = field(default_factory=list)
    exit_code: Optional[int] = None  # torchrun agent's exit code on this node
    failures: List[RankFailure] = field(default_factory=list)
    returns: Dict[int, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    supervisor: Optional[Supervisor] = None
    stacks: CallStacks = field(default_factory=CallStacks)  # where the ranks were when the job was stopped
    restarts: CallRestarts = field(default_factory=CallRestarts)  # the gang's in-step restarts of the ranks
    first_started: Optional[float] = None
    first_output: Optional[float] = None  # the first start's first line (a restart's are in its record)
    seat: Optional[Seat] = None  # this node's place in the current start (@torchrun(spares))
    deadlines: Optional[JobDeadlines] = None  # the preflight job's own deadlines; None: a user's call
    launch: NodeLaunch = field(init=False)  # what each start of the ranks is made of

    def __post_init__(self) -> None:
        self.launch = NodeLaunch(self.session, self.plan, self.index)

    @property
    def node_index(self) -> int:
        return self.session.topology.node_index

    @property
    def workdir(self) -> str:
        return self.launch.workdir

    @property
    def log_dir(self) -> Optional[str]:
        return self.launch.log_dir

    def run(self) -> TorchrunResult:
        try:
            self.enter()
            env = self.prepare()
            self.supervise(env)
            if self.benched and self.session.client is not None and self.session.client.news.call_over(self.index):
                pass  # sat the call out while the active nodes finished it: nothing of its own to report
            elif self.exit_code == 0 and self.session.cause is None:
                self.finish_ok()
            else:
                self.finish_failed()
        finally:
            result = self.record()
            in_flight = sys.exc_info()[1]
            if in_flight is not None:  # the result on the error raised, as ``error.result``
                with contextlib.suppress(AttributeError):  # a user's exception may refuse it
                    in_flight.result = result  # type: ignore[attr-defined]
        return result

    def enter(self) -> None:
        client = self.session.client
        assert client is not None
        self.rdzv_port = client.enter_call(self.index, self.plan.entry_name)
        if self.rdzv_port is None:
            raise self._aborted()
        self.seat = client.seats.get((self.index, 0))
        if self.plan.rdzv_port is not None:  # pinned: every node has it
            self.rdzv_port = self.plan.rdzv_port

    def supervise(self, env: Dict[str, str]) -> None:
        """Run this node's torchrun, and each restart the gang decides, until one ends for good."""
        client = self.session.client
        assert client is not None
        if self.deadlines is not None:
            self.deadlines.went()
        while True:
            if self.benched:  # a spare, or taken out: no ranks here until a restart brings it in
                decided = client.news.sit_out(self.index, self.restarts.restart)
            else:
                self._supervise_once(env)
                decided = self.restarts.decided(client, self.index, self.session.defaults.restarts, self.exit_code,
                                             self._report_own_failure, self.session.config.secondary_grace + 2.0)
            if decided is None:
                return
            env = self._restart(decided)

    @property
    def prunes(self) -> bool:
        """Whether this node prunes the host's other runs: a local run's nodes share the control's host
        (each scan reads every run's directory there: 0.03 CPU-s at 3,800 runs)."""
        return self.session.is_control or not self.session.topology.is_local

    @property
    def benched(self) -> bool:
        return self.seat is not None and self.seat.node_rank is None

    def prepare(self) -> Dict[str, str]:
        """The call's directories and entry file; the first start's argv and environment."""
        self.argv, env = self.launch.prepare(self.seat, int(self.rdzv_port or 0))
        return env

    def _restart(self, decided: msg.Restart) -> Dict[str, str]:
        """Restart ``decided.restart`` (this node's old ranks are gone): the next
        start's rendezvous and environment, the replaced ranks' records cleared."""
        sup = self.supervisor
        self.restarts.begin(decided, sup.started_at if sup else None, sup.ended_at if sup else None,
                         self.launch.rank_starts(self.restarts.restart))
        assert self.session.client is not None
        self.seat = self.session.client.seats.get((decided.index, decided.restart))
        clear_round(self.workdir)
        self.failures, self.exit_code = [], None
        if self.plan.rdzv_port is None:  # pinned: the same port for every start
            self.rdzv_port = decided.rdzv_port
        if self.session.is_control and decided.swapped_in is not None:
            say(swap_line(self.index, decided, self.session.defaults.restarts, self.session.client.hosts()))
        elif self.session.is_control:
            say("call %d: restarting every node's ranks (restart %d of %d): %s"
                % (self.index + 1, decided.restart, self.session.defaults.restarts, decided.cause.summary))
        self.argv, env = self.launch.command(self.seat, int(self.rdzv_port or 0), decided.restart)
        return env

    def _supervise_once(self, env: Dict[str, str]) -> None:
        client = self.session.client
        assert client is not None
        gang_stop = GangStop(self.node_index, self.index, self.session.defaults.shutdown_grace,
                             report=lambda cause: client.report_failure(cause, call=self.index),
                             verdict=lambda: client.cause, wait_verdict=lambda s: client.wait_for_verdict(s))
        live = LiveCard(client, self.session.context.card.refresh)

        def should_stop() -> Optional[StopReason]:
            live.tick()
            reason = gang_stop.check() or (
                self.deadlines.stop_reason(self.workdir) if self.deadlines is not None else None)
            if reason is None and client.news.restart_after(self.index, self.restarts.restart) is not None:
                if self.supervisor is not None:
                    self.supervisor.before_stop = None  # no stacks: the ranks start again at once
                return "the gang restarts the ranks"
            return reason

        try:
            with Supervisor(self.argv, env=env, shutdown_grace=self.session.defaults.shutdown_grace,
                            also_under=lambda: self.launch.warm.pid if self.launch.warm else None,
                            before_stop=lambda: self.stacks.collect(self.session, self.index, self.supervisor,
                                                                   self.workdir),
                            on_told=gang_stop.told) as sup, \
                    GpuUsage(os.environ, every=client.config.progress_send) as gpus:  # asked as often as it is sent
                self.supervisor = sup
                self.first_started = self.first_started or sup.started_at
                self.restarts.started(sup.started_at)
                assert self.launch.files is not None  # prepare() made them
                if self.prunes:
                    self.launch.files.prune()  # other runs' logs: while torchrun imports torch, off the critical path
                quiet = lambda: None if sup.last_output is None else time.monotonic() - sup.last_output  # noqa: E731
                with client.watching(quiet, ProgressTracker(self.workdir, gpu=gpus.latest).sample):
                    self.exit_code = sup.wait(should_stop=should_stop)
                    self.first_output = self.first_output or sup.first_output
        except BaseException:
            # Told to stop (SIGTERM, Ctrl-C, @timeout): not our error to word; where the ranks were goes to the log.
            self.stacks.share(self.session, self.index, self.rdzv_port is not None)
            if self.stacks.stacks:
                say(stacks.summarize(self.stacks.stacks, full=FULL_REPORT))
            raise

    def _report_own_failure(self) -> None:
        self.failures = self._read_failures()
        self._send_failure(self._own_cause())

    def _send_failure(self, cause: Cause) -> None:
        """To the gang, with its start of the ranks (not taken for a restart's ranks)."""
        assert self.session.client is not None
        self.session.client.report_failure(cause, call=self.index, report=self._report(self.failures),
                                           restart=self.restarts.restart)

    def _read_failures(self) -> List[RankFailure]:
        found = merge_failures(read_failures(self.workdir), read_agent_failures(self.workdir, self.node_index))
        return [node_report.completed(node_report.named(f), self.log_dir) for f in found]

    def finish_ok(self) -> None:
        """This node's ranks all succeeded; the control waits for every node's."""
        client = self.session.client
        assert client is not None
        if self.plan.function is not None:
            self.returns = functions.read_returns(self.workdir)
        rank0 = functions.result_path(self.workdir, 0)
        client.call_done(self.index, Path(rank0).read_bytes() if os.path.exists(rank0) else None, self._report())
        if client.speaks_for_gang:  # the control reports on the whole gang: every node's end first
            if not client.wait_call_done(self.index):
                raise self._aborted()
            view = client.call_view(self.index)
            if self.plan.function is not None and 0 not in self.returns:
                if view.rank0 is not None:  # kept only once its MAC checked out (gang/calls.py)
                    functions.alias_flow_module()
                    self.returns[0] = pickle.loads(view.rank0)
                elif view.rank0_error:
                    raise TorchrunInvalidArgument(view.rank0_error)

    def finish_failed(self) -> None:
        """The gang's verdict heard (this node's own failure reported first), what the failure screen
        shows gathered, and the error ``call_error`` chooses raised."""
        client = self.session.client
        assert client is not None
        self.stacks.share(self.session, self.index, self.rdzv_port is not None)
        reported = False
        if self.exit_code != 0:
            self.failures = self.failures if self.restarts.reported else self._read_failures()
            if client.cause is None:
                if not self.restarts.reported:
                    self._send_failure(self._own_cause())
                reported = True
                client.wait_for_verdict(self.session.config.secondary_grace + 2.0)
        cause = client.cause or self._own_cause()
        if not reported and client.cause is not None and client.cause.kind not in CONTROL_GONE:
            # Stopped by the gang: the service keeps only the report, for the control's card and record.
            self._send_failure(client.cause)
        self.stacks.gather(self.session, self.index)
        raise call_error(self._outcome(client, cause))

    def _outcome(self, client: GangClient, cause: Cause) -> CallOutcome:
        """What the failure screen shows: a local run's nodes share the control's log, so only the
        control's error says where (unless the control is gone)."""
        topology = self.session.topology
        speaks = self.session.is_control or not topology.is_local or cause.kind in CONTROL_GONE
        ran = speaks and node_report.any_rank_ran(self.workdir, self.failures, client, self.index)
        logs = node_report.logs_line(self.session, self.log_dir, ran) if speaks else ""
        where, suspects = (self.stacks.stacks, self.stacks.suspects(self.session, cause)) if speaks else ({}, [])
        elsewhere = node_report.failed_elsewhere(client, self.index, self.node_index) if speaks else []
        if suspects and self.stacks.culprits is not None:  # a suspect is not an echo of itself
            elsewhere = sorted(set(elsewhere) - {s.rank for s in self.stacks.culprits.suspects})
        outcome = CallOutcome(self.node_index, cause, self.exit_code, tuple(self.failures), tuple(self.argv),
                              same_log=topology.is_local, host=socket.gethostname(), stacks=where, logs=logs,
                              elsewhere=tuple(elsewhere), suspects=tuple(suspects))
        if own_rank_failed(outcome) and self.plan.function is not None:
            rank = failing_rank(self.failures)
            exc = functions.read_exception(self.workdir, rank) if rank is not None else None
            if exc is not None and rank is not None:
                return dataclasses.replace(outcome, rank_exception=functions.with_rank(exc, rank))
        return outcome

    def record(self) -> TorchrunResult:
        """The call's result, whatever happened; the work directory removed."""
        try:
            topology, client = self.session.topology, self.session.client
            sup = self.supervisor
            gang_view = GangView()
            if client is not None:
                view = client.call_view(self.index)
                gang_view = GangView(dict(view.joined_at), dict(view.finished_at), dict(view.reports))
            ranks = read_rank_records(self.workdir, self.failures) if self.workdir else []
            seat = self.seat
            result = TorchrunResult(
                command=self.argv, call=self.index, exit_code=self.exit_code, returns=self.returns, ranks=ranks,
                node_index=topology.node_index, num_nodes=topology.num_nodes, nproc_per_node=self.plan.nproc,
                started_at=self.first_started or (sup.started_at if sup and sup.started_at else self.started),
                ended_at=(sup.ended_at if sup and sup.ended_at else time.time()),
                first_output_at=self.first_output or (sup.first_output if sup else None),
                main_addr=topology.main_addr, local_addr=self.launch.local_addr, rdzv_port=self.rdzv_port,
                gang_port=client.port if client else None,
                restarts=max([r.restart or 0 for r in ranks] + [self.restarts.restart]),
                in_step_restarts=with_ranks_start(self.restarts.records,
                                                  self.launch.rank_starts(self.restarts.restart)),
                log_dir=self.log_dir, cause=self.session.cause, gang=gang_view, **self.stacks.record(),
                ran=what_ran.record(self.plan, self.argv, self.log_dir, topology.node_index),
                progress=client.progress_record() if client is not None else None,
                role=seat.role if seat else "active", spare_nodes=list(seat.bench.spares) if seat else [],
                out_nodes=list(seat.bench.out) if seat else [],
            )
            self.session.kept(result)
            return result
        finally:
            self.launch.release()

    def _aborted(self) -> GangAborted:
        cause = self.session.cause or Cause(CauseKind.CONTROL_LOST, "the gang was stopped")
        return self.session.aborted(cause)

    def _own_cause(self) -> Cause:
        cause = node_report.own_cause(self.node_index, self.index, self.exit_code, self.failures)
        return self.deadlines.own_cause(cause) if self.deadlines is not None else cause

    def _report(self, failures: Optional[List[RankFailure]] = None) -> NodeReport:
        return node_report.report(self.workdir, self.log_dir, failures or [],
                                  self.supervisor.started_at if self.supervisor else None)


def run_call(session: GangSession, plan: CallPlan) -> TorchrunResult:
    """One call; a rank whose argparse wanted a value for a key given as
    ``True`` is told what metaflow-torchrun 0.2 passed instead."""
    try:
        with session.in_call() as index:
            return CallRun(session, plan, index).run()
    except BaseException as e:
        error = e if isinstance(e, (TorchrunFailed, GangAborted)) else e.__cause__  # a function's own exception
        if isinstance(error, (TorchrunFailed, GangAborted)):  # its message, not a user exception's args
            add_argparse_hint(error, plan.true_keys)
        raise


def add_argparse_hint(error: TorchrunException, keys: Tuple[str, ...]) -> None:
    if not keys:
        return
    text = error.message
    for failure in getattr(error, "failures", None) or []:
        text += "\n%s\n%s" % (failure.message, failure.traceback)
    cause = getattr(error, "cause", None)
    if cause is not None:
        text += "\n%s\n%s" % (cause.message or "", cause.traceback or "")
    hint = argparse_hint(text, keys)
    if hint:
        error.message = "%s\n\n%s" % (error.message, hint)


