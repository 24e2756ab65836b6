"""One ``current.torch.run`` call on one node, in phases: enter (the control announces
the rendezvous port), prepare, supervise (restarts included), finish (ok or failed), record.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..base import timeouts
from ..cause import CONTROL_GONE, Cause, CauseKind
from ..errors import (FULL_REPORT, GangAborted, TorchrunException, TorchrunFailed, TorchrunInvalidArgument,
                      TorchrunInterrupted, rank_raised)
from ..gang import NodeReport, Seat
from ..gang.client import send_last_progress
from ..gang.gang_progress import ProgressTracker
from ..host import GpuUsage, say
from ..launch import CallPlan
from ..launch.command import argparse_hint
from ..procs import RankFailure, clear_round, functions, merge_failures, read_agent_failures, read_failures, stacks
from ..record import GangView, TorchrunResult, read_rank_records, what_ran, with_ranks_start
from . import node_report
from .call_launch import NodeLaunch, swap_line
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
    where: CallStacks = field(default_factory=CallStacks)  # where the ranks were when the job was stopped
    again: CallRestarts = field(default_factory=CallRestarts)  # the gang's in-step restarts of the ranks
    first_started: Optional[float] = None
    first_output: Optional[float] = None  # the first start's first line (a restart's are in its record)
    seat: Optional[Seat] = None  # this node's place in the current start (@torchrun(spares))
    watch: Optional[Any] = None  # preflight.JobDeadlines: a job's own deadlines; None: a user's call
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
        if self.seat is not None:
            self.session.bench = self.seat.bench
        if self.plan.rdzv_port is not None:  # pinned: every node has it
            self.rdzv_port = self.plan.rdzv_port

    def supervise(self, env: Dict[str, str]) -> None:
        """Run this node's torchrun, and each restart the gang decides, until one ends for good."""
        client = self.session.client
        assert client is not None
        if self.watch is not None:
            self.watch.went()
        while True:
            if self.benched:  # a spare, or taken out: no ranks here until a restart brings it in
                decided = client.news.sit_out(self.index, self.again.restart)
            else:
                self._supervise_once(env)
                decided = self.again.decided(client, self.index, self.session.defaults.restarts, self.exit_code,
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

    def _restart(self, decided: Any) -> Dict[str, str]:
        """Restart ``decided.restart`` (this node's old ranks are gone): the next
        start's rendezvous and environment, the replaced ranks' records cleared."""
        sup = self.supervisor
        self.again.begin(decided, sup.started_at if sup else None, sup.ended_at if sup else None,
                         self.launch.rank_starts(self.again.restart))
        assert self.session.client is not None
        self.seat = self.session.client.seats.get((decided.index, decided.restart))
        self.session.bench = decided.bench
        clear_round(self.workdir)
        self.failures, self.exit_code = [], None
        if self.plan.rdzv_port is None:  # pinned: the same port for every start
            self.rdzv_port = decided.rdzv_port
        if self.session.is_control and decided.swapped_in is not None:
            server = self.session.server
            say(swap_line(self.index, decided, self.session.defaults.restarts, server.hosts() if server else {}))
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
        live = LiveCard(self.session)

        def should_stop() -> Optional[StopReason]:
            live.tick()
            reason = gang_stop.check() or (self.watch.stop_reason(self.workdir) if self.watch is not None else None)
            if reason is None and client.news.restart_after(self.index, self.again.restart) is not None:
                if self.supervisor is not None:
                    self.supervisor.before_stop = None  # no stacks: the ranks start again at once
                return "the gang restarts the ranks"
            return reason

        try:
            with Supervisor(self.argv, env=env, shutdown_grace=self.session.defaults.shutdown_grace,
                            also_under=lambda: self.launch.warm.pid if self.launch.warm else None,
                            before_stop=lambda: self.where.collect(self.session, self.index, self.supervisor,
                                                                   self.workdir),
                            on_told=gang_stop.told) as sup, \
                    GpuUsage(os.environ, every=client.config.progress_send) as gpus:  # asked as often as it is sent
                self.supervisor = sup
                self.first_started = self.first_started or sup.started_at
                self.again.started(sup.started_at)
                assert self.launch.files is not None  # prepare() made them
                if self.prunes:
                    self.launch.files.prune()  # other runs' logs: while torchrun imports torch, off the critical path
                client.quiet = lambda: None if sup.last_output is None else time.monotonic() - sup.last_output
                client.training = ProgressTracker(self.workdir, gpu=gpus.latest).sample
                self.exit_code = sup.wait(should_stop=should_stop)
                self.first_output = self.first_output or sup.first_output
                send_last_progress(client)
        except BaseException:
            # Told to stop (SIGTERM, Ctrl-C, @timeout): not our error to word; where the ranks were goes to the log.
            self.where.share(self.session, self.index, self.rdzv_port is not None)
            if self.where.stacks:
                say(stacks.summarize(self.where.stacks, full=FULL_REPORT))
            raise
        finally:
            client.quiet = client.training = None

    def _report_own_failure(self) -> None:
        self.failures = self._read_failures()
        self._send_failure(self._own_cause())

    def _send_failure(self, cause: Cause) -> None:
        """To the gang, with its start of the ranks (not taken for a restart's ranks)."""
        assert self.session.client is not None
        self.session.client.report_failure(cause, call=self.index, report=self._report(self.failures),
                                           restart=self.again.restart)

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
        server = self.session.server
        if server is not None:
            if not client.wait_call_done(self.index):
                raise self._aborted()
            view = server.call_view(self.index)
            if self.plan.function is not None and 0 not in self.returns:
                if view.rank0 is not None:  # kept only once its MAC checked out (gang/calls.py)
                    functions.alias_flow_module()
                    self.returns[0] = pickle.loads(view.rank0)
                elif view.rank0_error:
                    raise TorchrunInvalidArgument(view.rank0_error)

    def finish_failed(self) -> None:
        client = self.session.client
        assert client is not None
        self.where.share(self.session, self.index, self.rdzv_port is not None)
        reported = False
        if self.exit_code != 0:
            self.failures = self.failures if self.again.reported else self._read_failures()
            if client.cause is None:
                if not self.again.reported:
                    self._send_failure(self._own_cause())
                self.session.reported = reported = True
                client.wait_for_verdict(self.session.config.secondary_grace + 2.0)
        cause = client.cause or self._own_cause()
        if not reported and client.cause is not None and client.cause.kind not in CONTROL_GONE:
            # Stopped by the gang: the service keeps only the report, for the control's card and record.
            self._send_failure(client.cause)
        self.where.gather(self.session, self.index)
        # A local run's nodes share the control's log: its error alone says where, unless it is gone.
        speaks = self.session.is_control or not self.session.topology.is_local or cause.kind in CONTROL_GONE
        ran = speaks and node_report.any_rank_ran(self.workdir, self.failures, self.session.server, self.index)
        logs = node_report.logs_line(self.session, self.log_dir, ran) if speaks else ""
        where, suspects = (self.where.stacks, self.where.suspects(self.session, cause)) if speaks else ({}, [])
        elsewhere = node_report.failed_elsewhere(self.session.server, self.index, self.node_index) if speaks else []
        if suspects and self.where.culprits is not None:  # a suspect is not an echo of itself
            elsewhere = sorted(set(elsewhere) - {s.rank for s in self.where.culprits.suspects})
        if cause.kind is CauseKind.RANK_FAILED and cause.node_index == self.node_index:
            self.session.reported = True
            error: TorchrunException = TorchrunFailed(
                self.exit_code if self.exit_code is not None else -1, self.node_index, self.failures, self.argv,
                stacks=where, logs=logs, host=socket.gethostname(), elsewhere=elsewhere)
            original = node_report.original_exception(self.plan, self.workdir, error)
            if original is not None:
                raise rank_raised(original, error) from None
            raise error
        if cause.kind is CauseKind.PREEMPTED and cause.node_index == self.node_index:
            raise TorchrunInterrupted(cause.summary + ".")  # told to stop, not failed: the gang saved (stop.py)
        raise GangAborted(self.node_index, cause, self.exit_code, same_log=self.session.topology.is_local,
                          stacks=where, logs=logs, elsewhere=elsewhere, suspects=suspects)

    def record(self) -> TorchrunResult:
        """The call's result, whatever happened; the work directory removed."""
        try:
            topology, server, client = self.session.topology, self.session.server, self.session.client
            sup = self.supervisor
            gang_view = GangView()
            if server is not None:
                view = server.call_view(self.index)
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
                restarts=max([r.restart or 0 for r in ranks] + [self.again.restart]),
                in_step_restarts=with_ranks_start(self.again.records, self.launch.rank_starts(self.again.restart)),
                log_dir=self.log_dir, cause=self.session.cause, gang=gang_view, **self.where.record(),
                ran=what_ran.record(self.plan, self.argv, self.log_dir, topology.node_index),
                progress=server.progress_record() if server is not None else None,
                role=seat.role if seat else "active", spare_nodes=list(seat.bench.spares) if seat else [],
                out_nodes=list(seat.bench.out) if seat else [],
            )
            self.session.results.append(result)
            return result
        finally:
            self.launch.release()

    def _aborted(self) -> GangAborted:
        cause = self.session.cause or Cause(CauseKind.CONTROL_LOST, "the gang was stopped")
        return self.session.aborted(cause)

    def _own_cause(self) -> Cause:
        cause = node_report.own_cause(self.node_index, self.index, self.exit_code, self.failures)
        return self.watch.own_cause(cause) if self.watch is not None else cause

    def _report(self, failures: Optional[List[RankFailure]] = None) -> NodeReport:
        return node_report.report(self.workdir, self.log_dir, failures or [],
                                  self.supervisor.started_at if self.supervisor else None)


class LiveCard:
    """The control's card, refreshed while the ranks report progress (or a
    straggler was named): at the first report, then every LIVE_CARD_EVERY."""

    def __init__(self, session: GangSession) -> None:
        self.session = session
        self.next = 0.0
        self.looked = 0.0

    def tick(self) -> None:
        server, refresh = self.session.server, self.session.live_card
        now = time.monotonic()
        if server is None or refresh is None or now < self.next or now - self.looked < timeouts.TRACK_INTERVAL:
            return
        self.looked = now
        record = server.progress_record()
        if record.step is not None or record.stragglers:
            self.next = now + timeouts.LIVE_CARD_EVERY
            refresh(record)


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


