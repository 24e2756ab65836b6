"""One ``current.torch.run`` call on one node, in named phases.

``enter`` (every node reaches the call; the control announces its rendezvous
port) -> ``prepare`` (work directory, environment, argv) -> ``supervise``
(torchrun runs; a gang abort stops it) -> ``finish_ok`` or ``finish_failed``
-> ``record`` (the result, whatever happened; the work directory removed).
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..procs import bootstrap, entry, functions, stacks
from ..cause import Cause, CauseKind
from ..gang import NodeReport
from ..errors import (FULL_REPORT, GangAborted, TorchrunException, TorchrunFailed, TorchrunInvalidArgument,
                      rank_raised)
from ..procs import (
    RankFailure,
    merge_failures,
    read_agent_failures,
    read_failures,
)
from ..host import route_to
from ..launch import argparse_hint
from ..launch import CallPlan
from ..launch import NodeFacts, prepare_launch
from .result import GangView, TorchrunResult, read_rank_records
from .session import GangSession
from . import node_report, what_ran
from .call_stacks import CallStacks
from ..host import say
from .stop import GangStop, interrupted, notice_path
from .supervisor import StopReason, Supervisor
from ..host import CallFiles
from ..procs import ARGS_FILE, RESTART_ENV, clear_round
from . import restarts as restarts_
from .restarts import InStepRestart
from ..host import step_log_dir

# Causes a node finds on its own (the control is gone or silent): the service
# may not know them, so they are never sent to it as a report's cause.
_CLIENT_SIDE = (CauseKind.CONTROL_LOST, CauseKind.CONTROL_UNRESPONSIVE, CauseKind.CONTROL_UNREACHABLE)


@dataclass
class CallRun:
    session: GangSession
    plan: CallPlan
    index: int
    workdir: str = ""
    log_dir: Optional[str] = None
    local_addr: str = ""
    rdzv_port: Optional[int] = None
    argv: List[str] = field(default_factory=list)
    exit_code: Optional[int] = None  # torchrun agent's exit code on this node
    failures: List[RankFailure] = field(default_factory=list)
    returns: Dict[int, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    supervisor: Optional[Supervisor] = None
    files: Optional[CallFiles] = None  # work and log directories (workdirs.py)
    # Where the ranks were when the job was stopped (call_stacks.py).
    where: CallStacks = field(default_factory=CallStacks)
    # Which start of the ranks runs (0: the first; k: the gang's restart k,
    # restarts.py) and every restart so far.
    restart: int = 0
    restarts: List[InStepRestart] = field(default_factory=list)
    first_started: Optional[float] = None  # the first torchrun's start
    _entry_path: str = ""
    _iface: Optional[str] = None
    _reported: bool = False  # this start's failure is already the gang's to decide on

    @property
    def node_index(self) -> int:
        return self.session.topology.node_index

    # -- phases ----------------------------------------------------------------

    def run(self) -> TorchrunResult:
        try:
            self.enter()
            env = self.prepare()
            self.supervise(env)
            if self.exit_code == 0 and self.session.cause is None:
                self.finish_ok()
            else:
                self.finish_failed()
        finally:
            result = self.record()
            in_flight = sys.exc_info()[1]
            if in_flight is not None:
                try:
                    in_flight.result = result  # type: ignore[attr-defined]
                except AttributeError:
                    pass
        return result

    def enter(self) -> None:
        client = self.session.client
        assert client is not None
        self.rdzv_port = client.enter_call(self.index, self.plan.entry_name)
        if self.rdzv_port is None:
            raise self._aborted()
        if self.plan.rdzv_port is not None:  # pinned (@torchrun(rdzv_port=N)): every node has it
            self.rdzv_port = self.plan.rdzv_port

    def prepare(self) -> Dict[str, str]:
        topology = self.session.topology
        self.local_addr, iface = route_to(topology.main_addr, topology.is_local)
        # Private to this user; the work directory goes in record() (workdirs.py).
        self.files = CallFiles(self.session.identity.log_key(self.index), self.node_index)
        self.workdir, self.log_dir = self.files.work_dir, self.files.log_dir
        plan = self.plan
        if plan.function is not None:
            try:
                functions.write_pickle(os.path.join(self.workdir, ARGS_FILE), plan.function_args)
            except Exception as e:
                raise TorchrunInvalidArgument("entrypoint_args cannot be pickled for the ranks: %s" % e) from None
            bootstrap_argv = [bootstrap.FUNCTION_FLAG, plan.function.encode(), self.workdir]
        else:
            bootstrap_argv = [plan.script or ""] + list(plan.entry_argv)
        # The script and its arguments reach the bootstrap through a file, never
        # through torchrun's own parser (entry.py): arguments stay verbatim.
        self._entry_path, self._iface = entry.write_entry(self.workdir, bootstrap_argv), iface
        return self._launch_environment()

    def _launch_environment(self) -> Dict[str, str]:
        """torchrun's argv and environment for this start of the ranks: a
        restart has a rendezvous of its own (a fresh id, the port the gang
        announced), the same static shape (rank 0 on node 0)."""
        topology = self.session.topology
        rdzv_id = self.session.identity.call_id(self.index) + ("-r%d" % self.restart if self.restart else "")
        node = NodeFacts(
            python=sys.executable, node_index=topology.node_index, num_nodes=topology.num_nodes,
            main_addr=topology.main_addr, local_addr=self.local_addr, iface=self._iface,
            rdzv_port=int(self.rdzv_port or 0), rdzv_id=rdzv_id,
            workdir=self.workdir, log_dir=self.log_dir, entry_path=self._entry_path, flow_dir=self.session.flow_dir,
        )
        self.argv, env = prepare_launch(self.plan, self.session.defaults, node, os.environ)
        if self.restart:
            env[RESTART_ENV] = str(self.restart)
        return entry.agent_environment(env, self.workdir, self._entry_path)

    def supervise(self, env: Dict[str, str]) -> None:
        """Run this node's torchrun; where the gang restarts the ranks
        (``@torchrun(restarts)``), run the next one, until one ends for good."""
        while True:
            self._supervise_once(env)
            decided = self._restart_decided()
            if decided is None:
                return
            env = self._restart(decided)

    def _supervise_once(self, env: Dict[str, str]) -> None:
        client = self.session.client
        assert client is not None

        # A node told to stop tells the gang; the gang's stop is graceful (stop.py).
        gang_stop = GangStop(self.node_index, self.index, self.session.defaults.shutdown_grace,
                             report=lambda cause: client.report_failure(cause, call=self.index),
                             verdict=lambda: client.cause, wait_verdict=lambda s: client.wait_for_verdict(s),
                             notice=notice_path())

        def should_stop() -> Optional[StopReason]:
            reason = gang_stop.check() or self.stop_reason()
            if reason is None and client.restart_after(self.index, self.restart) is not None:
                if self.supervisor is not None:
                    self.supervisor.before_stop = None  # no stacks: the ranks start again at once
                return "the gang restarts the ranks"
            return reason

        try:
            with Supervisor(self.argv, env=env, shutdown_grace=self.session.defaults.shutdown_grace,
                            before_stop=lambda: self.where.collect(self.session, self.index, self.supervisor, self.workdir), on_told=gang_stop.told) as sup:
                self.supervisor = sup
                self._started(sup)
                client.quiet = lambda: None if sup.last_output is None else time.monotonic() - sup.last_output
                self.exit_code = sup.wait(should_stop=should_stop)
        except BaseException:
            # Told to stop (SIGTERM, Ctrl-C, @timeout): the error is not ours
            # to word, so where the ranks were goes to the log.
            self.where.share(self.session, self.index, self.rdzv_port is not None)
            if self.where.stacks:
                say(stacks.summarize(self.where.stacks, full=FULL_REPORT))
            raise
        finally:
            client.quiet = None

    def _started(self, sup: Supervisor) -> None:
        if self.first_started is None:
            self.first_started = sup.started_at
        if self.restarts and self.restarts[-1].restarted_at is None:
            self.restarts[-1] = dataclasses.replace(self.restarts[-1], restarted_at=sup.started_at)

    def _restart_decided(self) -> Optional[Any]:
        """The gang's restart of this call's ranks, if it decided one; this
        node's own failure, while restarts are left, is reported first and the
        decision heard (the service restarts, or ends the gang)."""
        client = self.session.client
        assert client is not None
        decided = client.restart_after(self.index, self.restart)
        if decided is not None or self.restart >= self.session.defaults.restarts:
            return decided
        if self.exit_code in (0, None) or client.cause is not None:
            return None
        self.failures = self._read_failures()
        client.report_failure(self._own_cause(), call=self.index, report=self._report(self.failures),
                              restart=self.restart)
        self._reported = True
        return client.wait_for_restart_or_verdict(self.index, self.restart, self.session.config.secondary_grace + 2.0)

    def _restart(self, decided: Any) -> Dict[str, str]:
        """Carry out restart ``decided.restart``: this node's old ranks are
        gone (the supervisor stopped them); the next start's rendezvous and
        environment, with the replaced ranks' records cleared."""
        sup = self.supervisor
        self.restarts = restarts_.with_ranks_start(self.restarts, self._rank_starts())
        self.restarts.append(InStepRestart(
            decided.restart, decided.cause, ran_from=sup.started_at if sup else None, failed_at=decided.cause.time,
            stopped_at=sup.ended_at if sup else None))
        clear_round(self.workdir)
        self.failures, self._reported, self.exit_code = [], False, None
        self.restart = decided.restart
        if self.plan.rdzv_port is None:  # pinned: the same port for every start
            self.rdzv_port = decided.rdzv_port
        if self.session.is_control:
            say("call %d: restarting every node's ranks (restart %d of %d): %s"
                % (self.index + 1, decided.restart, self.session.defaults.restarts, decided.cause.summary))
        return self._launch_environment()

    def _rank_starts(self) -> List[Optional[float]]:
        return [r.start for r in read_rank_records(self.workdir, []) if (r.restart or 0) == self.restart] \
            if self.workdir else []

    def _read_failures(self) -> List[RankFailure]:
        return [node_report.completed(node_report.named(f), self.log_dir) for f in merge_failures(
            read_failures(self.workdir),
            read_agent_failures(self.workdir, self.node_index),
        )]

    def stop_reason(self) -> Optional[str]:
        """A reason of the call's own to stop its job (runtime/preflight.py's deadline)."""
        return None

    def finish_ok(self) -> None:
        """This node's ranks all succeeded: tell the gang; the control waits for
        every node to finish the call (it reports on the whole gang)."""
        client = self.session.client
        assert client is not None
        if self.plan.function is not None:
            self.returns = functions.read_returns(self.workdir)
        rank0 = functions.result_path(self.workdir, 0)
        client.call_done(self.index, _read_bytes(rank0) if os.path.exists(rank0) else None, self._report())
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
            self.failures = self.failures if self._reported else self._read_failures()
            if client.cause is None:
                if not self._reported:
                    client.report_failure(self._own_cause(), call=self.index, report=self._report(self.failures),
                                          restart=self.restart)
                self.session.reported = True
                reported = True
                client.wait_for_verdict(self.session.config.secondary_grace + 2.0)
        cause = client.cause or self._own_cause()
        if not reported and client.cause is not None and client.cause.kind not in _CLIENT_SIDE:
            # Stopped by the gang: the service has its cause already and only
            # keeps the report, so the control's card and record show this
            # node's ranks (their exits, durations, last lines) too.
            client.report_failure(client.cause, call=self.index, report=self._report(self.failures),
                                  restart=self.restart)
        self.where.gather(self.session, self.index)
        self.session.announce(cause)
        # On a local run every node writes to the control's log: the control's
        # error alone says where the ranks were and where the logs are, unless the
        # control is gone or silent: then this node's is the only one.
        speaks = self.session.is_control or not self.session.topology.is_local or cause.kind in _CLIENT_SIDE
        logs = self._logs_line() if speaks else ""
        where = self.where.stacks if speaks else {}
        elsewhere = node_report.failed_elsewhere(self.session.server, self.index, self.node_index) if speaks else []
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
            raise interrupted(cause)  # told to stop, not failed: the gang saved (stop.py)
        raise GangAborted(self.node_index, cause, self.exit_code, same_log=self.session.topology.is_local,
                          stacks=where, logs=logs, elsewhere=elsewhere)

    def _logs_line(self) -> str:
        """Where every rank's whole output is: on a local run one directory
        holds every node's; on a cluster each node's host keeps its own."""
        if not self.log_dir:
            return ""
        if self.session.topology.is_local:
            text = "Every rank's output, whole: %s" % step_log_dir(self.log_dir)
        else:
            text = "This node's ranks' output, whole: %s on %s (each node's host keeps its own)" % (
                self.log_dir, socket.gethostname())
        if self.session.card_hint:
            self.session.card_hint_said = True
            text += "\nThe card: %s" % self.session.card_hint
        return text

    def record(self) -> TorchrunResult:
        try:
            return self._record()
        finally:
            if self.files is not None:
                self.files.close()  # the work directory goes, whatever happened

    def _record(self) -> TorchrunResult:
        topology = self.session.topology
        sup = self.supervisor
        server = self.session.server
        gang_view = GangView()
        if server is not None:
            view = server.call_view(self.index)
            gang_view = GangView(dict(view.joined_at), dict(view.finished_at), dict(view.reports))
        ranks = read_rank_records(self.workdir, self.failures) if self.workdir else []
        cause = self.session.cause
        client = self.session.client
        result = TorchrunResult(
            command=self.argv,
            node_index=topology.node_index,
            num_nodes=topology.num_nodes,
            nproc_per_node=self.plan.nproc,
            exit_code=self.exit_code,
            started_at=self.first_started or (sup.started_at if sup and sup.started_at else self.started),
            ended_at=(sup.ended_at if sup and sup.ended_at else time.time()),
            main_addr=topology.main_addr,
            local_addr=self.local_addr,
            rdzv_port=self.rdzv_port,
            gang_port=client.port if client else None,
            ranks=ranks,
            restarts=max([r.restart or 0 for r in ranks] + [self.restart]),
            in_step_restarts=restarts_.with_ranks_start(self.restarts, self._rank_starts()),
            log_dir=self.log_dir,
            cause=cause,
            gang=gang_view,
            returns=self.returns,
            call=self.index,
            stacks=dict(self.where.stacks),
            stack_seconds=round(self.where.seconds, 3),
            ran=what_ran.record(self.plan, self.argv, self.log_dir, topology.node_index),
        )
        self.session.results.append(result)
        return result

    # -- helpers -----------------------------------------------------------------

    def _aborted(self) -> GangAborted:
        cause = self.session.cause or Cause(CauseKind.CONTROL_LOST, "the gang was stopped")
        self.session.announce(cause)
        return self.session.aborted(cause)

    def _own_cause(self) -> Cause:
        return node_report.own_cause(self.node_index, self.index, self.exit_code, self.failures)

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
        if isinstance(error, (TorchrunFailed, GangAborted)):
            # The message was the block; a hint goes on it (BaseException's
            # args are the user's for a function's exception: untouched).
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


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()

