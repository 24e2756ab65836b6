"""The gang of one ``@torchrun`` step, in phases: ``join``, ``user_code`` (a gang
abort interrupts it, and ends the task after ``INTERRUPT_GRACE``), ``in_call``,
``step_succeeded`` / ``step_failed`` (the control stays until every node has left), ``close``.
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import sys
import threading
import time
import traceback
from typing import Iterator, List, Optional

from ..base import timeouts
from ..base.text import first_line
from ..cause import Cause, CauseKind
from ..errors import (GangAborted, TorchrunCallRefused, TorchrunException, TorchrunFailed, TorchrunNotRetried,
                      is_refusal)
from ..gang.bench import Bench
from ..gang.client import GangClient
from ..gang.config import GangConfig
from ..gang.node_compare import JobRecord, PreflightRecord
from ..gang.server import GangServer
from ..gang.topology import Topology
from ..host.console import say
from ..host.logs import retention_policy, where_logs_are
from ..host import log
from ..record.result import TorchrunResult
from .context import StepContext
from .local_nodes import local_node_cut_off, local_node_ends, local_node_verdict, runtime_gone

_log = log.get("runtime.session")

# Stops the step's code when the gang aborts; real-time, as user code uses SIGUSR1/2.
INTERRUPT_SIGNAL = signal.SIGRTMIN + 2


class Phase(enum.Enum):
    NEW = "new"
    IN_STEP = "in step"
    IN_CALL = "in current.torch.run"
    LEFT = "left"


class GangSession:
    """The step's gang on this node: the context it was started with (read-only), its one client,
    on the control the gang service it hosts (started and closed here, read only through the
    client), and what the step's calls left (their results, the preflight job's record)."""

    def __init__(self, context: StepContext):
        self.context = context
        self.config = gang_config(context)
        self.phase = Phase.NEW
        self.calls_made = 0
        self._service: Optional[GangServer] = None
        self.client: Optional[GangClient] = None
        self._results: List[TorchrunResult] = []
        self._job: Optional[JobRecord] = None  # the preflight's collective job, once it ran (the control's)
        self._job_ran = False
        self._card_hint_said = False
        self._logs_said = False
        self._closed = False
        self._interruptible = False
        self._in_user_code = False
        self._main = threading.main_thread().ident
        self._call_error: Optional[BaseException] = None  # what the last failed call raised

    @property
    def cause(self) -> Optional[Cause]:
        return self.client.cause if self.client is not None else None

    @property
    def results(self) -> List[TorchrunResult]:
        return list(self._results)

    @property
    def ranks_ran(self) -> bool:
        """Whether a call of the step started torchrun on this node: a step refused before that has no card
        worth a line (its card says the refusal, which its error says)."""
        return any(r.exit_code is not None for r in self._results)

    @property
    def last_result(self) -> Optional[TorchrunResult]:
        return self._results[-1] if self._results else None

    @property
    def bench(self) -> Bench:
        """Who sits calls out (@torchrun(spares)), as the latest call's start or restart said it."""
        heard = self.client.news.latest_bench() if self.client is not None else None
        return heard if heard is not None else Bench.initial(self.context.topology.num_nodes,
                                                             self.context.defaults.spares)

    @property
    def preflight_job(self) -> Optional[JobRecord]:
        return self._job

    def preflight_record(self) -> Optional[PreflightRecord]:
        """The gang's preflight findings (the control's), for the step's record."""
        mode = self.context.preflight.mode
        return self.client.preflight_record(mode) if self.client is not None and mode else None

    def kept(self, result: TorchrunResult) -> None:
        """A call's result, whatever happened to it, in order."""
        self._results.append(result)

    def job_ran(self, job: Optional[JobRecord]) -> None:
        """The preflight's collective job ran (``job``: its record, on the control): once per attempt."""
        self._job_ran, self._job = True, job

    @property
    def job_due(self) -> bool:
        return not self._job_ran

    def card_line(self) -> str:
        """The command that opens the card, said once with a failure's logs ("" without a card)."""
        hint = self.context.card.hint
        if not hint:
            return ""
        self._card_hint_said = True
        return "The card: %s" % hint

    @property
    def card_hint_said(self) -> bool:
        return self._card_hint_said

    def missing_nodes(self) -> List[int]:
        """The nodes that never joined (the control's view; none elsewhere)."""
        return self.client.missing() if self.client is not None else []

    def join(self) -> None:
        context, ports = self.context, self.context.topology.ports
        if self.context.is_control:
            assert isinstance(context.secret, bytes), "the control holds the gang's secret itself"
            # A local node's task that ends unjoined ends the gang.
            self._service = GangServer(self.config, bind_host(self.context.topology), ports, secret=context.secret,
                                       progress=say, host_check=context.preflight.host_check,
                                       node_ends=local_node_ends(self.context.topology),
                                       on_verdict=local_node_verdict(self.context.topology),
                                       on_cut_off=local_node_cut_off(self.context.topology)).start()
            ports = (self._service.port,)
        self.client = GangClient(self.config, self.context.topology.main_addr, ports, self.context.node_index,
                                 secret=context.secret, on_abort=self._on_abort, progress=say,
                                 preflight=context.preflight.measure, facts=self._service).start()
        # A round trip, so a node that dies at once is lost, not missing; not a starting control's wait.
        self.client.joined.wait(timeouts.JOIN_WAIT)
        self.phase = Phase.IN_STEP

    @contextlib.contextmanager
    def user_code(self) -> Iterator[None]:
        """Around the step's code: a gang abort stops it."""
        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(INTERRUPT_SIGNAL, self._interrupted) if in_main else None
        self._interruptible = in_main
        self._in_user_code = True
        try:
            if self.cause is not None:
                raise self.aborted(self.cause)
            yield
        finally:
            self._interruptible = False
            self._in_user_code = False
            if in_main:
                signal.signal(INTERRUPT_SIGNAL, previous or signal.SIG_DFL)

    @contextlib.contextmanager
    def in_call(self) -> Iterator[int]:
        """Around one call: its own code watches the gang, so no interrupts."""
        index = self.calls_made
        self.calls_made += 1
        was = self._interruptible
        self._interruptible = False
        self.phase = Phase.IN_CALL
        try:
            with _timed("node %d: call %d" % (self.context.node_index, index)):
                yield index
        finally:
            self._call_error = sys.exc_info()[1] or self._call_error  # step_cause says where, after the reset
            self.phase = Phase.IN_STEP
            self._interruptible = was
            if was and self.cause is not None and sys.exc_info()[1] is None:
                raise self.aborted(self.cause)

    def aborted(self, cause: Cause) -> GangAborted:
        """This node's error for a gang stopped by ``cause`` (a local run's shared log says a refusal once)."""
        return GangAborted(self.context.node_index, cause, same_log=self.context.topology.is_local)

    def _on_abort(self, cause: Cause) -> None:
        """On the gang client's reader thread, once; not while the code may handle a failed call."""
        if not self._interruptible or self._main is None or call_failed(self._call_error):
            return
        try:
            signal.pthread_kill(self._main, INTERRUPT_SIGNAL)
        except (OSError, ValueError):
            return
        threading.Thread(target=self._backstop, args=(cause,), daemon=True).start()

    def _interrupted(self, signum, frame) -> None:
        cause = self.cause
        if self._interruptible and cause is not None:
            self._interruptible = False
            raise self.aborted(cause)

    def _backstop(self, cause: Cause) -> None:
        deadline = time.monotonic() + timeouts.INTERRUPT_GRACE
        while self._in_user_code and self.phase is not Phase.LEFT:
            if time.monotonic() >= deadline:
                say("the gang stopped (%s) but this node's step did not stop within %gs of being interrupted "
                    "(stuck outside Python?): ending the task." % (cause.summary, timeouts.INTERRUPT_GRACE))
                os._exit(1)
            time.sleep(0.1)

    def step_succeeded(self) -> None:
        """Leave the gang (the control waits for every node); a gang aborted meanwhile fails this step too."""
        client = self.client
        if client is None:
            return
        client.wait_joined()
        if client.cause is not None and call_failed(self._call_error):
            return self._went_on(client, client.cause)
        if client.cause is None:
            client.leave(self.calls_made, ok=True)
            if self.context.is_control:
                client.wait_all_left()
        self.phase = Phase.LEFT
        if client.cause is not None:
            raise self.aborted(client.cause)

    def _went_on(self, client: GangClient, cause: Cause) -> None:
        """The step's code caught its failed call's exception and went on: this node leaves
        as a step that ended well; the node whose rank raised says it whole, the others one line."""
        client.leave(self.calls_made, ok=True)
        self.phase = Phase.LEFT
        error = self._call_error
        what = type(error).__name__
        if cause.node_index == self.context.node_index and isinstance(error, TorchrunException):
            say("your step caught %s from current.torch.run and went on; what it caught:\n%s" % (what, error.message))
        else:
            say("your step caught %s from current.torch.run and went on (%s)" % (what, first_line(cause.summary)))

    def step_failed(self, error: BaseException) -> Optional[GangAborted]:
        """Report this node's failure, unless it echoes the gang's; the error to raise instead, if
        any (a local run's call refused for the root cause's reason, said once in the shared log)."""
        client = self.client
        if client is None:
            return None
        own = not (reported(error) or client.cause is not None)
        if own and client.wait_joined():
            client.report_failure(self.step_cause(error))
            client.wait_for_verdict(2.0)
        client.leave(self.calls_made, ok=False)
        self.phase = Phase.LEFT
        cause = client.cause
        if cause is None:
            return None
        if (self.context.topology.is_local and isinstance(error, TorchrunCallRefused) and is_refusal(cause)
                and cause.node_index != self.context.node_index and same_problem(self.step_cause(error), cause)):
            return self.aborted(cause)
        return None

    def step_cause(self, error: BaseException) -> Cause:
        node = self.context.node_index
        message = str(error) if not isinstance(error, TorchrunException) else error.message
        exc_type = type(error).__name__
        first = first_line(message)
        call, tb = None, None
        # A refusal's text is the whole story: a traceback through our planning would only bury it.
        if isinstance(error, TorchrunCallRefused):
            summary, call = "node %d refused %s" % (node, first), error.call - 1
        elif isinstance(error, TorchrunNotRetried):
            summary = "node %d: %s" % (node, first)
        else:
            raised = self._call_error
            in_call = self.phase is Phase.IN_CALL or (raised is not None and raised in (error, error.__cause__))
            where = _where(self.calls_made, in_call)
            summary = "node %d failed in its step %s: %s: %s" % (node, where, exc_type, first)
            tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))[-16000:]
        return Cause(CauseKind.STEP_FAILED, summary, node_index=node, exc_type=exc_type, message=message[:4000],
                     traceback=tb, call=call)

    def close(self) -> None:
        """Once (the step's wrapper, then ``task_finished``): a second call must not linger again."""
        self.phase = Phase.LEFT
        if self._closed:
            return
        self._closed = True
        with _timed("node %d: closing the gang (the control lingers after a failure)" % self.context.node_index):
            if self.context.warm is not None:
                self.context.warm.close()
            if self.client is not None:
                self.client.close()
            if self._service is not None:
                if not runtime_gone():
                    self._service.linger(self.config.start_timeout)
                self._service.close()

    def say_where_logs_are(self) -> None:
        """Once, on a local run's control: every node's per-rank files are on this host."""
        context = self.context
        if self._logs_said or not (context.is_control and context.topology.is_local) or self.cause is not None:
            return  # (a failure's error names the folder already)
        log_dirs = [r.log_dir for r in self._results if r.log_dir]
        if log_dirs:
            self._logs_said = True
            say(where_logs_are(log_dirs[-1], retention_policy(self.context.defaults.knobs)))


def call_failed(error: Optional[BaseException]) -> bool:
    """Whether a call raised its ranks' failure (here or elsewhere): step code that catches it goes on."""
    return isinstance(error, (TorchrunFailed, GangAborted))


def reported(error: BaseException) -> bool:
    """Whether ``error`` is a failure the gang already has: a call's (its own ranks' failure was
    reported as the call ended; a gang abort is the gang's own), or a function rank's exception
    raised in its place (``errors.rank_raised``)."""
    return call_failed(error) or isinstance(error.__cause__, TorchrunFailed)


@contextlib.contextmanager
def _timed(what: str) -> Iterator[None]:
    """Debug records of ``what`` begun and ended, with its duration."""
    began, raising = time.monotonic(), ""
    _log.debug("%s: begun", what)
    try:
        yield
    except BaseException as e:
        raising = ", raising %s" % type(e).__name__
        raise
    finally:
        _log.debug("%s: ended after %.3fs%s", what, time.monotonic() - began, raising)


def same_problem(mine: Cause, cause: Cause) -> bool:
    """Whether ``cause`` says what ``mine`` says, as both crossed the wire (which cuts a long message)."""
    sent = Cause.from_wire(mine.to_wire())
    return sent is not None and sent.message == cause.message


def _where(calls_made: int, in_call: bool) -> str:
    if in_call:
        return "in call %d of current.torch.run" % calls_made
    return "before current.torch.run" if calls_made == 0 else "after call %d of current.torch.run" % calls_made


def gang_config(context: StepContext) -> GangConfig:
    defaults, topology, knobs = context.defaults, context.topology, context.defaults.knobs
    return GangConfig(gang_id=context.identity.gang_id, num_nodes=topology.num_nodes, restarts=defaults.restarts,
                      heartbeat_timeout=defaults.heartbeat_timeout, start_timeout=defaults.start_timeout,
                      hang_timeout=defaults.hang_timeout, progress_interval=knobs.progress_seconds,
                      straggler_ratio=knobs.straggler_ratio, straggler_seconds=knobs.straggler_seconds,
                      spares=defaults.spares, min_nodes=defaults.min_nodes, regrow=defaults.regrow,
                      survives_loss=topology.survives_loss, swap_stragglers=defaults.swap_stragglers)


def bind_host(topology: Topology) -> str:
    if topology.is_local:
        return "127.0.0.1"
    return "::" if ":" in topology.main_addr else "0.0.0.0"
