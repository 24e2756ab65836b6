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
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..procs import bootstrap, entry, functions, stacks
from ..cause import Cause, CauseKind
from ..gang import NodeReport, ProgressTracker
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
from ..procs import ARGS_FILE
from ..host import step_log_dir
from .. import timeouts

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
        entry_path = entry.write_entry(self.workdir, bootstrap_argv)
        node = NodeFacts(
            python=sys.executable, node_index=topology.node_index, num_nodes=topology.num_nodes,
            main_addr=topology.main_addr, local_addr=self.local_addr, iface=iface,
            rdzv_port=int(self.rdzv_port or 0), rdzv_id=self.session.identity.call_id(self.index),
            workdir=self.workdir, log_dir=self.log_dir, entry_path=entry_path, flow_dir=self.session.flow_dir,
        )
        self.argv, env = prepare_launch(plan, self.session.defaults, node, os.environ)
        return entry.agent_environment(env, self.workdir, entry_path)

    def supervise(self, env: Dict[str, str]) -> None:
        client = self.session.client
        assert client is not None
        # A node told to stop tells the gang; the gang's stop is graceful (stop.py).
        gang_stop = GangStop(self.node_index, self.index, self.session.defaults.shutdown_grace,
                             report=lambda cause: client.report_failure(cause, call=self.index),
                             verdict=lambda: client.cause, wait_verdict=lambda s: client.wait_for_verdict(s),
                             notice=notice_path())
        live = LiveCard(self.session)  # the control's card, refreshed between the checks

        def should_stop() -> Optional[StopReason]:
            return live.tick() or gang_stop.check() or self.stop_reason()

        try:
            with Supervisor(self.argv, env=env, shutdown_grace=self.session.defaults.shutdown_grace,
                            before_stop=lambda: self.where.collect(self.session, self.index, self.supervisor, self.workdir), on_told=gang_stop.told) as sup:
                self.supervisor = sup
                client.quiet = lambda: None if sup.last_output is None else time.monotonic() - sup.last_output
                client.training = ProgressTracker(self.workdir).sample
                self.exit_code = sup.wait(should_stop=should_stop)
        except BaseException:
            # Told to stop (SIGTERM, Ctrl-C, @timeout): the error is not ours to word, so where the ranks were goes to the log.
            self.where.share(self.session, self.index, self.rdzv_port is not None)
            if self.where.stacks:
                say(stacks.summarize(self.where.stacks, full=FULL_REPORT))
            raise
        finally:
            client.quiet = client.training = None

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
            self.failures = [node_report.completed(node_report.named(f), self.log_dir) for f in merge_failures(
                read_failures(self.workdir),
                read_agent_failures(self.workdir, self.node_index),
            )]
            if client.cause is None:
                client.report_failure(self._own_cause(), call=self.index, report=self._report(self.failures))
                self.session.reported = True
                reported = True
                client.wait_for_verdict(self.session.config.secondary_grace + 2.0)
        cause = client.cause or self._own_cause()
        if not reported and client.cause is not None and client.cause.kind not in _CLIENT_SIDE:
            # Stopped by the gang: the service has its cause already and only
            # keeps the report, so the control's card and record show this
            # node's ranks (their exits, durations, last lines) too.
            client.report_failure(client.cause, call=self.index, report=self._report(self.failures))
        self.where.gather(self.session, self.index)
        self.session.announce(cause)
        # On a local run every node writes to the control's log: the control's
        # error alone says where the ranks were and where the logs are, unless the
        # control is gone or silent: then this node's is the only one.
        speaks = self.session.is_control or not self.session.topology.is_local or cause.kind in _CLIENT_SIDE
        logs = self._logs_line() if speaks else ""
        where, suspects = (self.where.stacks, self.where.suspects(self.session, cause)) if speaks else ({}, [])  # stacks, culprit
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
                          stacks=where, logs=logs, elsewhere=elsewhere, suspects=suspects)

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
            started_at=(sup.started_at if sup and sup.started_at else self.started),
            ended_at=(sup.ended_at if sup and sup.ended_at else time.time()),
            main_addr=topology.main_addr,
            local_addr=self.local_addr,
            rdzv_port=self.rdzv_port,
            gang_port=client.port if client else None,
            ranks=ranks,
            restarts=max([r.restart or 0 for r in ranks] or [0]),
            log_dir=self.log_dir,
            cause=cause,
            gang=gang_view,
            returns=self.returns,
            call=self.index,
            **self.where.record(),
            ran=what_ran.record(self.plan, self.argv, self.log_dir, topology.node_index),
            progress=server.progress_record() if server is not None else None,
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


class LiveCard:
    """The control's card, refreshed while a call runs and its ranks report
    progress (or a straggler was named): at the first report, then every
    LIVE_CARD_EVERY. Looked at every TRACK_INTERVAL at most."""

    def __init__(self, session: GangSession) -> None:
        self.session = session
        self.next = 0.0
        self.looked = 0.0

    def tick(self) -> Optional[StopReason]:
        """Refresh the card when due; never a reason to stop (None)."""
        server, refresh = self.session.server, self.session.live_card
        now = time.monotonic()
        if server is None or refresh is None or now < self.next or now - self.looked < timeouts.TRACK_INTERVAL:
            return None
        self.looked = now
        record = server.progress_record()
        if record.step is not None or record.stragglers:
            self.next = now + timeouts.LIVE_CARD_EVERY
            refresh(record)
        return None


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

