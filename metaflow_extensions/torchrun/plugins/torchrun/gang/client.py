"""A node's end of the gang: one connection to the control's service for the
whole step. Its reader thread turns what it hears into state the step's thread
waits on and, when the gang aborts, calls ``on_abort`` once. Joining is
``joining.py``'s; what the service says of each call is kept by ``CallNews``.

The gang-wide facts the control's record and card need (every node's joined and
finished times and reports, the progress record, the hosts, who never joined) are
read through this client too, from the ``GangFacts`` it was built with: on the
control the in-process service's read-only view, elsewhere none (empty answers),
so the runtime has one code path for every node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from typing import Callable, Dict, Iterator, List, Optional, Protocol, Sequence, Set, Tuple, TypeVar, Union

from ..cause import Cause, CauseKind
from ..procs.flight import FlightSummary
from ..procs import flight as rank_flight
from ..procs import stacks as rank_stacks
from . import auth as gang_auth
from . import messages as msg
from . import wire
from .config import GangConfig
from ..base import timeouts
from .joining import Joiner, error_text
from .bench import Bench, Seat
from .calls import CallView
from .gang_progress import ProgressRecord
from .node_compare import PreflightRecord
from .gang_progress import NodeProgress
from .probing import Hearing, Prober
from ..host import log

_log = log.get("gang.client")
T = TypeVar("T")


class GangFacts(Protocol):
    """What the control reads of the gang beyond what every node hears: the service's own
    state, copied under its lock (``GangServer`` offers it; no socket between)."""

    def hosts(self) -> Dict[int, str]: ...

    def missing(self) -> List[int]: ...

    def not_back(self) -> List[int]: ...

    def call_view(self, index: int) -> CallView: ...

    def stacks_pending(self, index: int) -> List[int]: ...

    def reports_pending(self, index: int) -> List[int]: ...

    def preflight_record(self, mode: str) -> PreflightRecord: ...

    def progress_record(self) -> ProgressRecord: ...


# Heartbeat sources while a call's job runs: seconds since its ranks last wrote (hang_timeout's
# clock), and their progress summed up.
Quiet = Callable[[], Optional[float]]
Training = Callable[[], Optional[NodeProgress]]


class GangClient:
    """Every node's (the control's too): the verdict as it heard it, and what the step says and waits for."""

    def __init__(self, config: GangConfig, host: str, ports: Sequence[int], node_index: int,
                 secret: Union[bytes, Callable[[], bytes]], *, on_abort: Callable[[Cause], None] = lambda cause: None,
                 progress: Callable[[str], None] = lambda text: None,
                 preflight: Optional[Callable[[], msg.Preflight]] = None, facts: Optional[GangFacts] = None):
        """``secret``: or a function called once on the joining thread (a worker may wait for it).
        ``on_abort``: called once, on the reader thread, with the gang's verdict; ``progress``: what a
        node not joined yet tries; ``preflight``: what this node measured, sent on the join's thread
        right after joining, before any call; ``facts``: the control's view of the gang (module doc)."""
        self._get_secret: Optional[Callable[[], bytes]] = secret if callable(secret) else None
        self._secret = b"" if callable(secret) else gang_auth.check_secret(secret)
        self.config = config
        self.host = host
        self.ports = tuple(ports)
        self.port: Optional[int] = None
        self.node_index = node_index
        self.cause: Optional[Cause] = None
        self.joined = threading.Event()
        self.all_left = threading.Event()
        self._on_abort = on_abort
        self._progress = progress
        self._preflight = preflight
        self._facts = facts
        self._quiet: Optional[Quiet] = None  # while a call's job runs (``watching``)
        self._training: Optional[Training] = None
        self._saved: Optional[Callable[[], Optional[int]]] = None
        self._preflight_sent = threading.Event()
        self._changed = threading.Condition()  # the news, the verdict, the close: waited on together
        self._closing = threading.Event()
        self.news = CallNews(self._changed, node_index, config.num_nodes, lambda: self.cause is not None, self._closing)
        self.seats = self.news.seats
        self.hearing = Hearing()
        self._sock: Optional[socket.socket] = None
        self._early: bytes = b""
        self._send_lock = threading.Lock()
        self._left = False
        self._threads: List[threading.Thread] = []
        self._prober: Optional[Prober] = None  # once joined; its thread runs while the control is silent
        self._probing: Optional[threading.Thread] = None

    def start(self) -> "GangClient":
        """Join in the background: the step's code goes on meanwhile."""
        self._spawn(self.connect, "join")
        return self

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name="torchrun-gang-" + name, daemon=True)
        t.start()
        self._threads.append(t)

    def connect(self, give_up_after: Optional[float] = None) -> None:
        """Retrying while the control is not up yet: nodes start in any order."""
        patience = give_up_after if give_up_after is not None else self.config.start_timeout
        began = time.monotonic()
        if not self._have_secret():
            self.joined.set()
            return
        joiner = Joiner(self.config, self.host, self.ports, self.node_index, self._secret, self._closing,
                        self._progress)
        link = joiner.join(patience)
        if link is None:
            if not self._closing.is_set():
                self._set_cause(Cause(
                    CauseKind.CONTROL_UNREACHABLE,
                    "could not reach the control node's gang service at %s within %gs (last error: %s)"
                    % (joiner.where(), patience, error_text(joiner.last_error))))
            self.joined.set()
            return
        self._sock, self.port, self._early = link.sock, link.port, link.early
        if link.cause is not None:
            self._set_cause(link.cause)
        _log.debug("node %d: joined the gang at %s port %s in %.3fs", self.node_index, self.host, self.port,
                   time.monotonic() - began)
        self.hearing = Hearing()
        prober = Prober(self.config, self.host, link.port, self.node_index, self._secret, self.hearing,
                        self._set_cause, lambda: self.cause is not None or self.all_left.is_set(), self._closing)
        self._prober = prober
        for target, name in ((self._read_loop, "reader"), (self._beat_loop, "heartbeat")):
            self._spawn(target, name)
        self.joined.set()
        self._send_preflight()

    def _send_preflight(self) -> None:
        """After ``joined``: the step's code does not wait for it; ``enter_call`` does."""
        try:
            if self._preflight is not None:
                self._safe_send(self._preflight())
        except Exception as e:  # a check of our own must not cost the step
            self._safe_send(msg.Preflight(checks=(msg.PreflightCheck(
                "preflight", "warn", "could not measure: %s: %s" % (type(e).__name__, e)),)))
        finally:
            self._preflight_sent.set()

    def _have_secret(self) -> bool:
        if self._get_secret is None:
            return True
        try:
            self._secret = gang_auth.check_secret(self._get_secret())
        except Exception as e:
            self._set_cause(Cause(CauseKind.CONTROL_UNREACHABLE,
                                  "could not get the gang's secret: %s: %s" % (type(e).__name__, e)))
            return False
        self._get_secret = None
        return True

    def close(self) -> None:
        self._closing.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            wire.close_quietly(self._sock)
        for t in self._threads + ([self._probing] if self._probing is not None else []):
            if t is not threading.current_thread():
                t.join(timeout=2)
        with self._changed:
            self._changed.notify_all()

    def wait_joined(self) -> bool:
        """Until this node joined, or the gang is over before it could."""
        while not self.joined.wait(0.1):
            if self.cause is not None:
                break
        return self._sock is not None and self.cause is None

    @property
    def secret(self) -> bytes:
        """The gang's secret, once joined (empty before): what this node's snapshot store proves itself with."""
        return self._secret

    def enter_call(self, index: int, entry: str, snapshot_port: Optional[int] = None) -> Optional[int]:
        """The call's rendezvous port, or None if the gang aborted. The service answers once node 0 is
        there too, not every node: torchrun's rendezvous, watched by the gang, waits for the rest.
        ``snapshot_port``: where this node's snapshot store takes its peers (none: snapshots off)."""
        if not self.wait_joined():
            return None
        self._after_preflight()
        self._safe_send(msg.Call(index, entry[:1000], snapshot_port))
        entered = time.monotonic()
        _log.debug("node %d: call %d entered", self.node_index, index)
        go = self.news.go(index)
        port = go.rdzv_port if go is not None and self.cause is None else None
        _log.debug("node %d: call %d: %s after %.3fs", self.node_index, index,
                   "go (rendezvous port %s)" % port if port is not None else "no go", time.monotonic() - entered)
        return port

    def call_done(self, index: int, rank0: Optional[bytes], report: msg.NodeReport) -> None:
        """``rank0``: rank 0's pickled return value, when rank 0 ran here."""
        message = msg.CallDone(index, report)
        if rank0 is not None and len(rank0) <= wire.RANK0_MAX:
            message = msg.CallDone(index, report, rank0=rank0, rank0_proof=gang_auth.payload_proof(
                self._secret, self.config.gang_id, index, self.node_index, rank0))
        elif rank0 is not None:
            message = msg.CallDone(index, report, rank0_size=len(rank0))
        if not fits(message):
            message = msg.CallDone(index, report.cut(), message.rank0, message.rank0_proof, message.rank0_size)
        self._safe_send(message)
        _log.debug("node %d: call %d: done sent", self.node_index, index)

    def wait_call_done(self, index: int) -> bool:
        """The control reports on the whole gang; False when it aborted instead."""
        began = time.monotonic()
        done = self.news.wait_call_done(index)
        _log.debug("node %d: call %d: %s after %.3fs", self.node_index, index,
                   "every node done" if done else "not done", time.monotonic() - began)
        return done

    def send_stacks(self, index: int, stacks: Dict[int, str],
                    flights: Optional[Dict[int, FlightSummary]] = None) -> None:
        """Cut to fit one line (a stack is halved until it does); empty says none."""
        flights, budget = rank_flight.bound(flights or {}, wire.MAX_LINE // 8), wire.MAX_LINE // 2
        while True:
            message = msg.Stacks(index, rank_stacks.bound(stacks, budget), flights)
            if fits(message) or budget < 1024:
                break
            budget //= 2
        self._safe_send(message)

    def report_failure(self, cause: Cause, call: Optional[int] = None,
                       report: Optional[msg.NodeReport] = None, restart: int = 0) -> None:
        message = msg.Failed(cause, call, report, restart)
        if report is not None and not fits(message):
            message = msg.Failed(cause, call, report.cut(), restart)
        self._safe_send(message)
        _log.debug("node %d: failure reported (call %s): %s: %s", self.node_index, call, cause.kind.value,
                   cause.summary)

    def wait_for_verdict(self, seconds: float) -> Optional[Cause]:
        """After reporting a failure: the service may wait for a better cause than an echo."""
        began = time.monotonic()
        with self._changed:
            while self.cause is None and time.monotonic() < began + seconds and not self._closing.is_set():
                self._changed.wait(0.05)
        _log.debug("node %d: %s after %.3fs", self.node_index, "verdict heard" if self.cause else "no verdict",
                   time.monotonic() - began)
        return self.cause

    def _after_preflight(self) -> None:
        """The preflight goes first: after a ``leave`` the service hears it no more, and drops the node's
        connection for it (a control that left at once lost the all-left it waits for)."""
        while not self._preflight_sent.wait(0.05):
            if self.cause is not None or self._closing.is_set() or self._sock is None:
                break

    def leave(self, calls: int, ok: bool) -> None:
        """From now on this node's silence means nothing."""
        if self.joined.is_set():
            self._after_preflight()
        self._left = True
        self._safe_send(msg.Leave(calls, ok))
        _log.debug("node %d: left after %d calls (%s)", self.node_index, calls, "ok" if ok else "failed")

    def wait_all_left(self) -> bool:
        """The control's service must outlive every node's step."""
        while not self.all_left.wait(0.1):
            if self.cause is not None or self._closing.is_set():
                return False
        return True

    def _set_cause(self, cause: Cause) -> None:
        with self._changed:
            if self.cause is not None:
                return
            self.cause = cause
            self._changed.notify_all()
        _log.debug("node %d: the gang's verdict: %s: %s", self.node_index, cause.kind.value, cause.summary)
        try:
            self._on_abort(cause)
        except Exception:
            pass

    def _safe_send(self, message: msg.GangMessage) -> None:
        sock = self._sock
        if sock is None:
            return
        with self._send_lock:
            try:
                wire.send(sock, message.to_wire())
            except (OSError, ValueError):
                pass

    def _read_loop(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            sock.settimeout(self.config.heartbeat_interval)
        except OSError:  # EBADF: closed before this thread began (close() raced the join)
            return
        reader = wire.LineReader()
        self.hearing.on_link()
        data: Optional[bytes] = self._early
        while not self._closing.is_set():
            if data:
                self.hearing.on_link()
                try:
                    for message in reader.feed(data):
                        self._on_message(message)
                except wire.ProtocolError:
                    data = b""
            try:
                data = sock.recv(65536)
            except socket.timeout:
                data = None
            except OSError:
                data = b""
            if data:
                continue
            if self._closing.is_set() or self.all_left.is_set():
                return
            if data == b"":
                if not self._left:
                    self._set_cause(Cause(CauseKind.CONTROL_LOST, "lost the connection to the control node (node "
                                          "0): its task died or was killed", node_index=0))
                return
            silent = self.hearing.verdict(self.config, time.monotonic())  # probing.py
            if silent is not None:
                self._set_cause(silent)
                return

    def _on_message(self, line: wire.Message) -> None:
        """A line this client cannot read is skipped: the service proved itself at the handshake."""
        try:
            message = msg.parse(line)
        except wire.ProtocolError:
            return
        if isinstance(message, msg.Abort):
            self._set_cause(message.cause)
        elif isinstance(message, msg.AllLeft):
            self.all_left.set()
        else:
            self.news.heard(message)

    def _beat_loop(self) -> None:
        due = [0.0]  # progress rides one heartbeat every progress_send: the control parses less
        while not self._closing.wait(self.config.heartbeat_interval):
            if self._left and self.cause is not None:
                return
            self._safe_send(heartbeat(self._quiet, paced(self._training, due, self.config.progress_send),
                                      self._saved))
            self._probe_if_silent()

    def _probe_if_silent(self) -> None:
        """A silence's probes on a thread of their own (probing.py), one silence at a time."""
        prober, running = self._prober, self._probing
        if prober is None or (running is not None and running.is_alive()) or not prober.due(time.monotonic()):
            return
        self._probing = threading.Thread(target=prober.run, name="torchrun-gang-probe", daemon=True)
        self._probing.start()

    @contextlib.contextmanager
    def watching(self, quiet: Quiet, training: Training, saved: Optional[Callable[[], Optional[int]]] = None
                 ) -> Iterator[None]:
        """While one start of a call's ranks runs: its heartbeats carry ``quiet``, ``training`` and
        ``saved``; at the end, the last progress before this node's report (the paced heartbeats may
        have carried it seconds before the end)."""
        self._quiet, self._training, self._saved = quiet, training, saved
        try:
            yield
            self._safe_send(heartbeat(quiet, training, saved))
        finally:
            self._quiet = self._training = self._saved = None

    # The gang-wide facts: the control's view (``facts``), empty where there is none.
    @property
    def speaks_for_gang(self) -> bool:
        """Whether this node reports on the whole gang (the control: it waits for every node's end)."""
        return self._facts is not None

    def hosts(self) -> Dict[int, str]:
        return self._facts.hosts() if self._facts is not None else {}

    def missing(self) -> List[int]:
        return self._facts.missing() if self._facts is not None else []

    def not_back(self) -> List[int]:
        """The nodes lost that the gang went on without and that had not come back (the control's facts)."""
        return self._facts.not_back() if self._facts is not None else []

    def call_view(self, index: int) -> CallView:
        return self._facts.call_view(index) if self._facts is not None else CallView.of(None, index, {})

    def pending(self, index: int, stacks: bool, reports: bool) -> Set[int]:
        """The nodes whose stacks (and, with ``reports``, reports) of call ``index`` are still due."""
        if self._facts is None:
            return set()
        return set(self._facts.stacks_pending(index) if stacks else ()) | set(
            self._facts.reports_pending(index) if reports else ())

    def progress_record(self) -> Optional[ProgressRecord]:
        return self._facts.progress_record() if self._facts is not None else None

    def preflight_record(self, mode: str) -> Optional[PreflightRecord]:
        return self._facts.preflight_record(mode) if self._facts is not None else None


class CallNews:
    """What the service told a node of each call (the go, each restart, every node done, every node's
    stacks in): written by the reader thread, waited on by the step's under the client's one condition,
    which the verdict and the close notify too. Here, not in a module of its own: no hop on the call path."""

    def __init__(self, changed: threading.Condition, node_index: int, num_nodes: int,
                 verdict: Callable[[], bool], closing: threading.Event) -> None:
        self._changed = changed
        self._node, self._nodes = node_index, num_nodes
        self._verdict, self._closing = verdict, closing
        self.seats: Dict[Tuple[int, int], Seat] = {}  # (call, restart) -> this node's place in it
        self._bench: Optional[Bench] = None  # as the latest go or restart said it
        self._go: Dict[int, msg.Go] = {}
        self._restarts: Dict[int, msg.Restart] = {}  # call -> the latest restart decided
        self._snapshot_peers: Dict[int, msg.SnapshotPeers] = {}  # call -> where its snapshots' peers are, latest
        self._done: Set[int] = set()  # calls every active node finished
        self._stacks_in: Set[int] = set()

    def heard(self, message: msg.GangMessage) -> bool:
        """False when ``message`` is no news of a call."""
        with self._changed:
            if isinstance(message, msg.Go):
                self._go[message.index] = message
                self.seats[(message.index, 0)] = message.bench.seat(self._node, self._nodes)
                self._bench = message.bench
            elif isinstance(message, msg.Restart):
                self.seats[(message.index, message.restart)] = message.bench.seat(self._node, self._nodes)
                known = self._restarts.get(message.index)
                if known is None or message.restart > known.restart:
                    self._restarts[message.index] = message
                    self._bench = message.bench
            elif isinstance(message, msg.SnapshotPeers):
                told = self._snapshot_peers.get(message.index)
                self._snapshot_peers[message.index] = message if told is None or message.source is not None \
                    or told.source is None else dataclasses.replace(message, source=told.source,
                                                                    source_node=told.source_node)
            elif isinstance(message, msg.CallAllDone):
                self._done.add(message.index)
            elif isinstance(message, msg.StacksIn):
                self._stacks_in.add(message.index)
            else:
                return False
            self._changed.notify_all()
        if isinstance(message, msg.Restart):
            _log.debug("node %d: restart %d of call %d decided (port %d)", self._node, message.restart,
                       message.index, message.rdzv_port)
        return True

    def _wait(self, until: Callable[[], bool], seconds: Optional[float] = None, verdict_ends: bool = True) -> None:
        """Until ``until()``, the close, ``seconds`` or (``verdict_ends``) the verdict."""
        deadline = None if seconds is None else time.monotonic() + seconds
        with self._changed:
            while not until() and not self._closing.is_set() and not (verdict_ends and self._verdict()):
                left = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
                if left <= 0:
                    return
                self._changed.wait(left)

    def latest_bench(self) -> Optional[Bench]:
        with self._changed:
            return self._bench

    def snapshot_peers(self, index: int) -> Optional[msg.SnapshotPeers]:
        """Where call ``index``'s snapshot shards go and a missing key is fetched from, as last told."""
        with self._changed:
            return self._snapshot_peers.get(index)

    def go(self, index: int) -> Optional[msg.Go]:
        self._wait(lambda: index in self._go)
        with self._changed:
            return self._go.get(index)

    def wait_call_done(self, index: int) -> bool:
        self._wait(lambda: index in self._done)
        return self.call_over(index)

    def call_over(self, index: int) -> bool:
        with self._changed:
            return index in self._done

    def wait_stacks_in(self, index: int, seconds: float) -> bool:
        """Until every node's stacks are in; not ended by the verdict: stacks are sent after a failure."""
        self._wait(lambda: index in self._stacks_in, seconds, verdict_ends=False)
        with self._changed:
            return index in self._stacks_in

    def restart_after(self, index: int, restart: int) -> Optional[msg.Restart]:
        """The latest restart of call ``index`` if later than ``restart``, else None."""
        with self._changed:
            latest = self._restarts.get(index)
        return latest if latest is not None and latest.restart > restart else None

    def wait_for_restart_or_verdict(self, index: int, restart: int, seconds: float) -> Optional[msg.Restart]:
        self._wait(lambda: self.restart_after(index, restart) is not None, seconds)
        return self.restart_after(index, restart)

    def sit_out(self, index: int, restart: int) -> Optional[msg.Restart]:
        """A benched node: until a later restart (which may bring it in); None at the call's end or the verdict."""
        self._wait(lambda: index in self._done or self.restart_after(index, restart) is not None)
        return self.restart_after(index, restart)


def fits(message: msg.GangMessage) -> bool:
    """The caller trims a message too long for a line rather than lose it (a lost done hangs the control)."""
    try:
        wire.encode(message.to_wire())
    except ValueError:
        return False
    return True


def paced(training: Optional[Callable[[], Optional[NodeProgress]]], due: List[float],
          every: float = timeouts.PROGRESS_SEND) -> Optional[Callable[[], Optional[NodeProgress]]]:
    """``training`` when a heartbeat should carry the progress (``due`` holds when next), else None."""
    now = time.monotonic()
    if training is None or now < due[0]:
        return None
    due[0] = now + every
    return training


def heartbeat(quiet: Optional[Callable[[], Optional[float]]],
              training: Optional[Callable[[], Optional[NodeProgress]]] = None,
              saved: Optional[Callable[[], Optional[int]]] = None) -> msg.Heartbeat:
    """A failing probe sends none rather than no beat."""
    seconds, progress, step = _ask(quiet), _ask(training), _ask(saved)
    return msg.Heartbeat(None if seconds is None else max(0.0, float(seconds)), progress,
                         step if isinstance(step, int) and step >= 0 else None)


def _ask(probe: Optional[Callable[[], Optional[T]]]) -> Optional[T]:
    try:
        return probe() if probe is not None else None
    except Exception:
        return None
