"""The gang of one ``@torchrun`` step, from its first line to its last.

Named phases, in the order a step goes through them:

- ``join``: the control starts the gang service; every node joins it in the
  background, so the step's own code is not delayed.
- ``user_code``: while the step's code runs outside ``current.torch.run``, an
  abort of the gang interrupts it (a signal raises ``GangAborted`` in the main
  thread), and ends the task if it does not stop within ``INTERRUPT_GRACE``.
- ``run_call``: one ``current.torch.run`` call (``call.py``).
- ``step_succeeded`` / ``step_failed``: the node leaves the gang, saying how
  its step ended; a failure of its own becomes the gang's root cause. The
  control stays until every node has left, so a late failure still reaches
  everyone.
- ``close``: nothing of the gang is left in the process.
- ``say_where_logs_are``: on a local run, the control names the directory of
  every rank's files on this host.
"""

from __future__ import annotations

import contextlib
import enum
import logging
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
from ..host import base_dir, route_to, say
from ..host import retention_policy, where_logs_are
from ..host import log
from ..base import timeouts

_log = log.get("runtime.session")

# Raised in the main thread to stop the step's code when the gang aborts. A
# real-time signal: user code (SLURM-style checkpoint triggers) uses SIGUSR1/2.
INTERRUPT_SIGNAL = signal.SIGRTMIN + 2


@dataclass
class PreflightState:
    """The step's preflight (runtime/preflight.py): its mode, and on the
    control the collective job's record once it ran."""

    mode: Optional[str] = None
    job_ran: bool = False
    job: Optional[JobRecord] = None
    # On the control: the node history's check of the gang's hosts (gang/handlers.py).
    host_check: Optional[HostCheck] = None
    history: Any = None  # runtime/preflight.History: the job's bandwidth against each host's past


class Phase(enum.Enum):
    NEW = "new"
    IN_STEP = "in step"
    IN_CALL = "in current.torch.run"
    LEFT = "left"


class GangSession:
    def __init__(
        self,
        identity: GangIdentity,
        defaults: StepDefaults,
        topology: Topology,
        flow_dir: Optional[str] = None,
        *,
        secret: Union[bytes, Callable[[], bytes]],
    ):
        """``secret``: the gang's secret (``secret.py``): bytes on the control,
        a function that fetches it on the other nodes (called while joining)."""
        self.identity = identity
        self.secret = secret
        self.defaults = defaults
        self.topology = topology
        self.is_control = topology.is_control
        self.flow_dir = flow_dir
        # A deprecation note is said once per step: per gang (per pathspec for 0.2's launcher).
        self.notes_key = identity.gang_id
        self.config = gang_config(identity, defaults, topology)
        self.phase = Phase.NEW
        self.calls_made = 0
        # The gang's facts as the control reads them (gang.GangFacts: the service, read only through
        # that); None on a worker. The service itself is _service, started and closed here alone.
        self.server: Optional[GangFacts] = None
        self._service: Optional[GangServer] = None
        self.client: Optional[GangClient] = None
        self.results: List[TorchrunResult] = []
        self.reported = False  # this node's own failure is already the gang's
        # `card view` of the control's card (decorator); a failed call's error names it.
        self.card_hint: Optional[str] = None
        self.card_hint_said = False
        # The control's card refreshed while a call runs (card.refresh_live; the decorator's).
        self.live_card: Optional[Callable[[ProgressRecord], None]] = None
        self._logs_said = False
        self._closed = False
        self._interruptible = False
        self._in_user_code = False
        self._main = threading.main_thread().ident
        self._previous_handler: Any = None
        self._call_error: Optional[BaseException] = None  # what the last failed call raised
        # This node's preflight (runtime/preflight.py): what it sends on joining,
        # and what the control keeps of the gang's.
        self.preflight_source: Optional[Callable[[], Any]] = None
        self.preflight = PreflightState()
        self.warm: Optional[WarmStart] = None  # the node's warm process (warm_start.py)
        # Who sits calls out (@torchrun(spares)): the step's start's, then as the latest call heard it.
        self.bench = Bench.initial(topology.num_nodes, defaults.spares)
        # Found as the step joins its gang, for every call: the address (and
        # interface) other nodes reach this one at; this user's base directory.
        self.route: Optional[Tuple[str, Optional[str]]] = None
        self.host_base: Optional[str] = None

    @property
    def cause(self) -> Optional[Cause]:
        return self.client.cause if self.client is not None else None

    @property
    def last_result(self) -> Optional[TorchrunResult]:
        return self.results[-1] if self.results else None

    # -- join ------------------------------------------------------------------

    def join(self) -> None:
        if self.warm is None:  # a local run's control started its own before Metaflow started its nodes
            self.warm = WarmStart.started_for_step(self.defaults)
        self.route, self.host_base = route_to(self.topology.main_addr, self.topology.is_local), _base_or_none()
        ports = self.topology.ports
        if self.is_control:
            assert isinstance(self.secret, bytes), "the control holds the gang's secret itself"
            service = GangServer(self.config, bind_host(self.topology), ports, secret=self.secret)
            service.progress, service.host_check = say, self.preflight.host_check
            # A local node's task that ends unjoined ends the gang.
            self.server = self._service = watch_local_nodes(service, self.topology).start()
            ports = (service.port,)
        self.client = GangClient(
            self.config, self.topology.main_addr, ports, self.topology.node_index, secret=self.secret
        )
        self.client.on_abort = self._on_abort
        self.client.progress = say
        self.client.preflight = self.preflight_source
        self.client.start()
        # Joining takes a round trip when the control is up: wait that long, so
        # that a node that dies at once is known to the gang (and so lost, not
        # missing), but not for a control that is still starting.
        self.client.joined.wait(timeouts.JOIN_WAIT)
        self.phase = Phase.IN_STEP

    # -- the step's own code -----------------------------------------------------

    @contextlib.contextmanager
    def user_code(self) -> Iterator[None]:
        """Around the step's code: a gang abort stops it."""
        in_main = threading.current_thread() is threading.main_thread()
        if in_main:
            self._previous_handler = signal.signal(INTERRUPT_SIGNAL, self._interrupted)
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
                signal.signal(INTERRUPT_SIGNAL, self._previous_handler or signal.SIG_DFL)

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

    def aborted(self, cause: Cause, own_exit_code: Optional[int] = None) -> GangAborted:
        """This node's error for a gang stopped by ``cause``. On a local run
        every node writes to the control's log, which says a refusal once."""
        return GangAborted(self.topology.node_index, cause, own_exit_code, same_log=self.topology.is_local)

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
        while time.monotonic() < deadline:
            if not self._in_user_code or self.phase is Phase.LEFT:
                return
            time.sleep(0.1)
        if self._in_user_code and self.phase is not Phase.LEFT:
            say("the gang stopped (%s) but this node's step did not stop within %gs of being "
                "interrupted (stuck outside Python?): ending the task." % (cause.summary, timeouts.INTERRUPT_GRACE))
            os._exit(1)

    # -- the step's end ----------------------------------------------------------

    def step_succeeded(self) -> None:
        """Leave the gang; the control waits for every node to leave. A gang
        that aborted meanwhile fails this node's step too."""
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
        """Report this node's failure, unless it is an echo of the gang's.
        Returns the error to raise instead of ``error``, if any: on a local run,
        a call refused for the same reason as the root cause's is an echo, said
        once in the shared log rather than once per node."""
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
        if isinstance(error, TorchrunCallRefused):
            # Refused before anything started: the user's line is in the
            # message; a traceback through our planning would only bury it.
            return Cause(CauseKind.STEP_FAILED, "node %d refused %s" % (node, _first_line(message)),
                         node_index=node, exc_type=exc_type, message=message[:4000], call=error.call - 1)
        if isinstance(error, TorchrunNotRetried):  # its text is the whole story: no traceback of ours
            return Cause(CauseKind.STEP_FAILED, "node %d: %s" % (node, _first_line(message)), node_index=node,
                         exc_type=exc_type, message=message[:4000])
        raised = self._call_error
        in_call = self.phase is Phase.IN_CALL or (raised is not None and raised in (error, error.__cause__))
        where = _where(self.calls_made, in_call)
        return Cause(
            CauseKind.STEP_FAILED,
            "node %d failed in its step %s: %s: %s" % (node, where, exc_type, _first_line(message)),
            node_index=node,
            exc_type=exc_type,
            message=message[:4000],
            traceback="".join(traceback.format_exception(type(error), error, error.__traceback__))[-16000:],
        )

    def close(self) -> None:
        """Once: the step's wrapper closes the gang as the step's code ends, and
        ``task_finished`` again for a step whose code never ran; a second call
        finds nothing left to do (and must not linger a second time)."""
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
        """Once, at the step's end, on the control of a local run: every node
        ran on this host, so its per-rank files are all here (the workers'
        Metaflow logs are empty locally: their output is in the control's).
        Not on a cluster, where each node's files are on its own pod or
        instance and its own task log holds its ranks."""
        if self._logs_said or not (self.is_control and self.topology.is_local):
            return
        if self.cause is not None:
            return  # the failure's error names the folder already
        log_dirs = [r.log_dir for r in self.results if r.log_dir]
        if log_dirs:
            self._logs_said = True
            say(where_logs_are(log_dirs[-1], retention_policy(self.defaults.knobs)))


def _base_or_none() -> Optional[str]:
    """``base_dir()``, or None: each call then tries again, and says why it cannot."""
    try:
        return base_dir()
    except OSError:
        return None


def call_failed(error: Optional[BaseException]) -> bool:
    """Whether a call raised its ranks' failure (here or on another node): the
    gang's cause is then that failure (the first wins), and step code that
    catches it goes on with its step, the call's ranks stopped on every node."""
    return isinstance(error, (TorchrunFailed, GangAborted))


def went_on(session: GangSession, cause: Cause) -> None:
    """The step's code caught its failed call's exception and went on: this node
    leaves the gang as a step that ended well. The node whose rank raised shows
    what it caught whole (the other nodes' errors point to this log), the others
    one line."""
    assert session.client is not None
    session.client.leave(session.calls_made, ok=True)
    session.phase = Phase.LEFT
    error = session._call_error
    what = type(error).__name__
    if cause.node_index == session.topology.node_index and isinstance(error, TorchrunException):
        say("your step caught %s from current.torch.run and went on; what it caught:\n%s" % (what, error.message))
    else:
        say("your step caught %s from current.torch.run and went on (%s)" % (what, _first_line(cause.summary)))


def linger(server: GangServer, start_timeout: float) -> None:
    """A failed gang's service stays a little while nodes are still coming:
    a node that is still starting learns the cause as it joins, instead of
    waiting ``start_timeout`` for a service that is gone. Not when the cause is
    that nodes never joined: their own ``start_timeout`` has passed too, and
    they have given up as well."""
    if server.cause is not None and server.cause.kind is CauseKind.NEVER_JOINED:
        return
    deadline = time.monotonic() + min(timeouts.LINGER, start_timeout)
    while not server.everyone_heard() and time.monotonic() < deadline:
        time.sleep(0.05)


@contextlib.contextmanager
def _timed(what: str) -> Iterator[None]:
    """Debug records (host/log.py) of ``what`` begun and ended, with its duration."""
    if not _log.isEnabledFor(logging.DEBUG):
        yield
        return
    began = time.monotonic()
    _log.debug("%s: begun", what)
    try:
        yield
    except BaseException as e:
        _log.debug("%s: ended after %.3fs, raising %s", what, time.monotonic() - began, type(e).__name__)
        raise
    _log.debug("%s: ended after %.3fs", what, time.monotonic() - began)


def same_problem(mine: Cause, cause: Cause) -> bool:
    """Whether ``cause`` says what this node's own cause ``mine`` says,
    compared as both crossed the wire (a long message is cut there)."""
    sent = Cause.from_wire(mine.to_wire())
    return sent is not None and sent.message == cause.message


def _where(calls_made: int, in_call: bool) -> str:
    """Where in the step a node's error was raised, for its cause."""
    if in_call:
        return "in call %d of current.torch.run" % calls_made
    return "before current.torch.run" if calls_made == 0 else "after call %d of current.torch.run" % calls_made


def _first_line(text: str) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else ""


def gang_config(identity: GangIdentity, defaults: StepDefaults, topology: Topology) -> GangConfig:
    """The gang's settings: the step's, and the knobs of Metaflow's configuration."""
    return GangConfig(
        gang_id=identity.gang_id,
        num_nodes=topology.num_nodes,
        heartbeat_timeout=defaults.heartbeat_timeout,
        start_timeout=defaults.start_timeout,
        progress_interval=defaults.knobs.progress_seconds,
        straggler_ratio=defaults.knobs.straggler_ratio,
        straggler_seconds=defaults.knobs.straggler_seconds,
        hang_timeout=defaults.hang_timeout,
        restarts=defaults.restarts,
        spares=defaults.spares,
    )


def bind_host(topology: Topology) -> str:
    if topology.is_local:
        return "127.0.0.1"
    return "::" if ":" in topology.main_addr else "0.0.0.0"
