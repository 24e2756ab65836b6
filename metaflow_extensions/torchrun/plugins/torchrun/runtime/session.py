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
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Tuple, Union

from ..cause import Cause, CauseKind
from ..errors import (GangAborted, TorchrunCallRefused, TorchrunException, TorchrunFailed, TorchrunNotRetried,
                      is_refusal)
from ..gang import (GangClient, GangConfig, GangFacts, GangIdentity, GangServer, HostCheck, JobRecord, ProgressRecord,
                    Topology)
from ..gang.bench import Bench
from ..launch import StepDefaults
from ..record import TorchrunResult
from .local_nodes import runtime_gone, watch_local_nodes
from .warm_start import WarmStart
from ..host import base_dir, log, retention_policy, route_to, say, where_logs_are
from ..base import timeouts
from ..base.text import first_line

_log = log.get("runtime.session")

# Stops the step's code when the gang aborts; real-time, as user code uses SIGUSR1/2.
INTERRUPT_SIGNAL = signal.SIGRTMIN + 2


@dataclass
class PreflightState:
    """The step's preflight (preflight.py): its mode; on the control, the job's record once it ran."""

    mode: Optional[str] = None
    job_ran: bool = False
    job: Optional[JobRecord] = None
    host_check: Optional[HostCheck] = None  # the control's check of the gang's hosts' history
    history: Any = None  # preflight.History: the job's bandwidth against each host's past


class Phase(enum.Enum):
    NEW = "new"
    IN_STEP = "in step"
    IN_CALL = "in current.torch.run"
    LEFT = "left"


class GangSession:
    def __init__(self, identity: GangIdentity, defaults: StepDefaults, topology: Topology,
                 flow_dir: Optional[str] = None, *, secret: Union[bytes, Callable[[], bytes]]):
        """``secret``: bytes on the control, a function that fetches it on the other nodes."""
        self.identity = identity
        self.secret = secret
        self.defaults = defaults
        self.topology = topology
        self.is_control = topology.is_control
        self.flow_dir = flow_dir
        self.notes_key = identity.gang_id
        self.config = gang_config(identity, defaults, topology)
        self.phase = Phase.NEW
        self.calls_made = 0
        # The control's read-only view of the gang service (_service, started and closed here alone).
        self.server: Optional[GangFacts] = None
        self._service: Optional[GangServer] = None
        self.client: Optional[GangClient] = None
        self.results: List[TorchrunResult] = []
        self.reported = False  # this node's own failure is already the gang's
        self.card_hint: Optional[str] = None
        self.card_hint_said = False
        self.live_card: Optional[Callable[[ProgressRecord], None]] = None
        self._logs_said = False
        self._closed = False
        self._interruptible = False
        self._in_user_code = False
        self._main = threading.main_thread().ident
        self._call_error: Optional[BaseException] = None  # what the last failed call raised
        self.preflight_source: Optional[Callable[[], Any]] = None
        self.preflight = PreflightState()
        self.warm: Optional[WarmStart] = None
        # Who sits calls out (@torchrun(spares)), as the latest call heard it.
        self.bench = Bench.initial(topology.num_nodes, defaults.spares)
        # Found as the step joins, for every call: the address (and interface) other nodes reach this one at.
        self.route: Optional[Tuple[str, Optional[str]]] = None
        self.host_base: Optional[str] = None

    @property
    def cause(self) -> Optional[Cause]:
        return self.client.cause if self.client is not None else None

    @property
    def last_result(self) -> Optional[TorchrunResult]:
        return self.results[-1] if self.results else None

    def join(self) -> None:
        if self.warm is None:  # a local run's control started its own before Metaflow started its nodes
            self.warm = WarmStart.started_for_step(self.defaults)
        self.route = route_to(self.topology.main_addr, self.topology.is_local)
        try:
            self.host_base = base_dir()
        except OSError:
            self.host_base = None  # each call tries again, and says why it cannot
        ports = self.topology.ports
        if self.is_control:
            assert isinstance(self.secret, bytes), "the control holds the gang's secret itself"
            service = GangServer(self.config, bind_host(self.topology), ports, secret=self.secret)
            service.progress, service.host_check = say, self.preflight.host_check
            # A local node's task that ends unjoined ends the gang.
            self.server = self._service = watch_local_nodes(service, self.topology).start()
            ports = (service.port,)
        self.client = GangClient(self.config, self.topology.main_addr, ports, self.topology.node_index,
                                 secret=self.secret)
        self.client.on_abort = self._on_abort
        self.client.progress = say
        self.client.preflight = self.preflight_source
        self.client.start()
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
            with _timed("node %d: call %d" % (self.topology.node_index, index)):
                yield index
        finally:
            self._call_error = sys.exc_info()[1] or self._call_error  # step_cause says where, after the reset
            self.phase = Phase.IN_STEP
            self._interruptible = was
            if was and self.cause is not None and sys.exc_info()[1] is None:
                raise self.aborted(self.cause)

    def aborted(self, cause: Cause) -> GangAborted:
        """This node's error for a gang stopped by ``cause`` (a local run's shared log says a refusal once)."""
        return GangAborted(self.topology.node_index, cause, same_log=self.topology.is_local)

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
            return went_on(self, client.cause)
        if client.cause is None:
            client.leave(self.calls_made, ok=True)
            if self.is_control:
                client.wait_all_left()
        self.phase = Phase.LEFT
        if client.cause is not None:
            raise self.aborted(client.cause)

    def step_failed(self, error: BaseException) -> Optional[GangAborted]:
        """Report this node's failure, unless it echoes the gang's; the error to raise instead, if
        any (a local run's call refused for the root cause's reason, said once in the shared log)."""
        client = self.client
        if client is None:
            return None
        own = not (self.reported or isinstance(error, GangAborted) or client.cause is not None)
        if own and client.wait_joined():
            client.report_failure(self.step_cause(error))
            client.wait_for_verdict(2.0)
        client.leave(self.calls_made, ok=False)
        self.phase = Phase.LEFT
        cause = client.cause
        if cause is None:
            return None
        if (self.topology.is_local and isinstance(error, TorchrunCallRefused) and is_refusal(cause)
                and cause.node_index != self.topology.node_index and same_problem(self.step_cause(error), cause)):
            return self.aborted(cause)
        return None

    def step_cause(self, error: BaseException) -> Cause:
        node = self.topology.node_index
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
        with _timed("node %d: closing the gang (the control lingers after a failure)" % self.topology.node_index):
            if self.warm is not None:
                self.warm.close()
            if self.client is not None:
                self.client.close()
            if self._service is not None:
                if self._service.cause is not None and not runtime_gone():
                    linger(self._service, self.config.start_timeout)
                self._service.close()

    def say_where_logs_are(self) -> None:
        """Once, on a local run's control: every node's per-rank files are on this host."""
        if self._logs_said or not (self.is_control and self.topology.is_local) or self.cause is not None:
            return  # (a failure's error names the folder already)
        log_dirs = [r.log_dir for r in self.results if r.log_dir]
        if log_dirs:
            self._logs_said = True
            say(where_logs_are(log_dirs[-1], retention_policy(self.defaults.knobs)))


def call_failed(error: Optional[BaseException]) -> bool:
    """Whether a call raised its ranks' failure (here or elsewhere): step code that catches it goes on."""
    return isinstance(error, (TorchrunFailed, GangAborted))


def went_on(session: GangSession, cause: Cause) -> None:
    """The step's code caught its failed call's exception and went on: this node leaves
    as a step that ended well; the node whose rank raised says it whole, the others one line."""
    assert session.client is not None
    session.client.leave(session.calls_made, ok=True)
    session.phase = Phase.LEFT
    error = session._call_error
    what = type(error).__name__
    if cause.node_index == session.topology.node_index and isinstance(error, TorchrunException):
        say("your step caught %s from current.torch.run and went on; what it caught:\n%s" % (what, error.message))
    else:
        say("your step caught %s from current.torch.run and went on (%s)" % (what, first_line(cause.summary)))


def linger(server: GangServer, start_timeout: float) -> None:
    """A failed gang's service stays a little, so a late node learns the cause as it
    joins rather than at ``start_timeout``; not when nodes never joined (they gave up too)."""
    if server.cause is not None and server.cause.kind is CauseKind.NEVER_JOINED:
        return
    deadline = time.monotonic() + min(timeouts.LINGER, start_timeout)
    while not server.everyone_heard() and time.monotonic() < deadline:
        time.sleep(0.05)


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


def gang_config(identity: GangIdentity, defaults: StepDefaults, topology: Topology) -> GangConfig:
    knobs = defaults.knobs
    return GangConfig(gang_id=identity.gang_id, num_nodes=topology.num_nodes, restarts=defaults.restarts,
                      heartbeat_timeout=defaults.heartbeat_timeout, start_timeout=defaults.start_timeout,
                      hang_timeout=defaults.hang_timeout, progress_interval=knobs.progress_seconds,
                      straggler_ratio=knobs.straggler_ratio, straggler_seconds=knobs.straggler_seconds,
                      spares=defaults.spares)


def bind_host(topology: Topology) -> str:
    if topology.is_local:
        return "127.0.0.1"
    return "::" if ":" in topology.main_addr else "0.0.0.0"
