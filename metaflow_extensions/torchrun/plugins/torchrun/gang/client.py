"""A node's end of the gang: joins when the step starts, heartbeats, hears news.

The client keeps one connection to the control's gang service for the whole
step. Its reader thread turns what it hears into state the step's main thread
waits on (joined, a call's go-ahead, everyone done) and, when the gang aborts,
calls ``on_abort`` once so the session can stop whatever the step is doing.

The client believes a service only once it proved it holds the gang's secret
(``auth``): anything else on a candidate port (another gang, another
program, an impostor) is passed over like a closed port.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Set, Union

from ..cause import Cause, CauseKind
from ..procs import stacks as rank_stacks
from . import auth as gang_auth
from . import messages as msg
from . import wire
from .config import GangConfig
from ..host import log

_log = log.get("gang.client")


# size: a node's whole side of the gang (join and handshake, the reader thread, heartbeats, call sync, leaving); issue 24 reworks it
class GangClient:
    """Runs on every node (the control included)."""

    def __init__(self, config: GangConfig, host: str, ports: Sequence[int], node_index: int,
                 secret: Union[bytes, Callable[[], bytes]]):
        """``secret``: the gang's (``secret.py``), or a function that gets it
        (called once, as joining starts, on the joining thread: a worker may
        have to wait for the control to publish it, and its step's code need
        not wait with it)."""
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
        self.on_abort: Callable[[Cause], None] = lambda cause: None
        # While a call's job runs: seconds since its ranks last wrote output,
        # sent with every heartbeat (the control's hang_timeout reads it).
        self.quiet: Optional[Callable[[], Optional[float]]] = None
        # This node's preflight (fingerprint and fitness checks), measured and
        # sent on the join's thread right after joining, before any call.
        self.preflight: Optional[Callable[[], msg.Preflight]] = None
        self._preflight_sent = threading.Event()
        self._go: Dict[int, int] = {}  # call index -> rendezvous port
        self._calls_done: Set[int] = set()
        self._news = threading.Condition()
        self._sock: Optional[socket.socket] = None
        self._early: bytes = b""
        self._send_lock = threading.Lock()
        self._closing = threading.Event()
        self._left = False
        self._threads: List[threading.Thread] = []

    # -- lifecycle -------------------------------------------------------

    def start(self) -> "GangClient":
        """Join in the background: the step's code goes on meanwhile."""
        t = threading.Thread(target=self.connect, name="torchrun-gang-join", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def connect(self, give_up_after: Optional[float] = None) -> None:
        """Connect and say hello, retrying while the control is not up yet: nodes
        start in any order (on Kubernetes workers often start first)."""
        patience = give_up_after if give_up_after is not None else self.config.start_timeout
        began = time.monotonic()
        deadline = began + patience
        last_error: Optional[BaseException] = None
        if not self._have_secret():
            self.joined.set()
            return
        while time.monotonic() < deadline and not self._closing.is_set():
            for port in self.ports:
                try:
                    self._handshake(port)
                    break
                except (OSError, ValueError, RuntimeError) as e:
                    last_error = e
            if self._sock is not None:
                break
            self._closing.wait(0.2)
        if self._sock is None:
            if not self._closing.is_set():
                self._set_cause(
                    Cause(
                        CauseKind.CONTROL_UNREACHABLE,
                        "could not reach the control node's gang service at %s (port %s) "
                        "within %gs (last error: %s)"
                        % (self.host, " or ".join(map(str, self.ports)), patience, last_error),
                    )
                )
            self.joined.set()
            return
        _log.debug("node %d: joined the gang at %s port %s in %.3fs", self.node_index, self.host, self.port,
                   time.monotonic() - began)
        for target, name in ((self._read_loop, "reader"), (self._beat_loop, "heartbeat")):
            t = threading.Thread(target=target, name="torchrun-gang-" + name, daemon=True)
            t.start()
            self._threads.append(t)
        self.joined.set()
        self._send_preflight()

    def _send_preflight(self) -> None:
        """After ``joined``: the step's code does not wait for it; a call
        does (``enter_call``), so the service has it before this node's call."""
        try:
            if self.preflight is not None:
                self._safe_send(self.preflight())
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

    def _handshake(self, port: int) -> None:
        """Prove this node holds the secret on ``port``, and have the service
        prove it too; a port held by anything but our gang (another gang's
        service, an unrelated server, an impostor) fails here and the next is
        tried."""
        sock = socket.create_connection((self.host, port), timeout=2)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(2)
            self._early = b""
            server_nonce = gang_auth.read_challenge(self._read_one(sock))
            client_nonce = gang_auth.new_nonce()
            wire.send(sock, gang_auth.hello(self._secret, self.config.gang_id, server_nonce, self.node_index,
                                            host=socket.gethostname(), pid=os.getpid(),
                                            client_nonce=client_nonce).to_wire())
            # Once a service has our hello it may count this node in: giving up
            # now would read as a node that died (a busy control answers late),
            # so its answer is waited for as long as any silence is.
            sock.settimeout(max(2.0, self.config.heartbeat_timeout))
            welcome = gang_auth.check_welcome(self._secret, self.config.gang_id, server_nonce, client_nonce,
                                              self.node_index, self._read_one(sock))
        except BaseException:
            wire.close_quietly(sock)
            raise
        sock.settimeout(None)
        self._sock = sock
        self.port = port
        if welcome.cause is not None:
            self._set_cause(welcome.cause)

    def _read_one(self, sock: socket.socket) -> wire.Message:
        """One line of the handshake (what came after it is kept for the
        reader): ValueError when it is not a JSON object, or too long."""
        data = self._early
        while b"\n" not in data:
            if len(data) > wire.PRE_AUTH_LINE:
                raise ValueError("not a gang service (a greeting that does not end)")
            chunk = sock.recv(4096)
            if not chunk:
                raise ValueError("connection closed during the handshake")
            data += chunk
        line, self._early = data.split(b"\n", 1)
        message = wire.decode(line)
        if message is None:
            raise ValueError("not a gang service")
        return message

    def close(self) -> None:
        self._closing.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            wire.close_quietly(self._sock)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=2)
        with self._news:
            self._news.notify_all()

    # -- what the session asks and says ------------------------------------

    def wait_joined(self) -> bool:
        """Block until this node joined, or the gang is over before it could."""
        while not self.joined.wait(0.1):
            if self.cause is not None:
                break
        return self._sock is not None and self.cause is None

    def enter_call(self, index: int, entry: str) -> Optional[int]:
        """Say this node reached call ``index``; the call's rendezvous port, or
        None if the gang aborted. The service answers once node 0 is there too
        (it checks the entrypoint against the nodes already there), not once
        every node is: torchrun's rendezvous, watched by the gang, waits for
        the rest."""
        if not self.wait_joined():
            return None
        while not self._preflight_sent.wait(0.05):  # the preflight goes first
            if self.cause is not None or self._closing.is_set() or self._sock is None:
                break
        self._safe_send(msg.Call(index, entry[:1000]))
        entered = time.monotonic()
        _log.debug("node %d: call %d entered", self.node_index, index)
        with self._news:
            while index not in self._go and self.cause is None and not self._closing.is_set():
                self._news.wait(0.2)
            port = self._go.get(index) if self.cause is None else None
        _log.debug("node %d: call %d: %s after %.3fs", self.node_index, index,
                   "go (rendezvous port %s)" % port if port is not None else "no go", time.monotonic() - entered)
        return port

    def call_done(self, index: int, rank0: Optional[bytes], report: msg.NodeReport) -> None:
        """This node's part of call ``index`` succeeded. ``rank0``: rank 0's
        pickled return value, when rank 0 ran here: sent with a MAC over its
        bytes, which the service checks before keeping them; a value too big
        for one line is not sent, only its size (the control says why)."""
        message = msg.CallDone(index, report)
        if rank0 is not None and len(rank0) <= wire.RANK0_MAX:
            message = msg.CallDone(index, report, rank0=rank0, rank0_proof=gang_auth.payload_proof(
                self._secret, self.config.gang_id, index, self.node_index, rank0))
        elif rank0 is not None:
            message = msg.CallDone(index, report, rank0_size=len(rank0))
        if not self._fits(message):
            message = msg.CallDone(index, report.cut(), message.rank0, message.rank0_proof, message.rank0_size)
        self._safe_send(message)
        _log.debug("node %d: call %d: done sent", self.node_index, index)

    def wait_call_done(self, index: int) -> bool:
        """The control waits for every node to finish a call, so that it can
        report on the whole gang; False when the gang aborted instead."""
        began = time.monotonic()
        with self._news:
            while index not in self._calls_done and self.cause is None and not self._closing.is_set():
                self._news.wait(0.2)
        _log.debug("node %d: call %d: %s after %.3fs", self.node_index, index,
                   "every node done" if index in self._calls_done else "not done", time.monotonic() - began)
        return index in self._calls_done

    def report_failure(self, cause: Cause, call: Optional[int] = None,
                       report: Optional[msg.NodeReport] = None) -> None:
        message = msg.Failed(cause, call, report)
        if report is not None and not self._fits(message):
            message = msg.Failed(cause, call, report.cut())
        self._safe_send(message)
        _log.debug("node %d: failure reported (call %s): %s: %s", self.node_index, call, cause.kind.value,
                   cause.summary)

    @staticmethod
    def _fits(message: msg.GangMessage) -> bool:
        """A message over the line limit would be refused by ``wire.encode``:
        the caller trims it rather than lose it (a lost done hangs the control)."""
        try:
            wire.encode(message.to_wire())
        except ValueError:
            return False
        return True

    def send_stacks(self, index: int, stacks: Dict[int, str]) -> None:
        """Where this node's ranks were when it stopped them (``stacks.py``),
        for the control's report; an empty dict says there were none."""
        budget = wire.MAX_LINE // 2
        while True:
            message = msg.Stacks(index, rank_stacks.bound(stacks, budget))
            if self._fits(message) or budget < 1024:
                break
            budget //= 2
        self._safe_send(message)

    def wait_for_verdict(self, seconds: float) -> Optional[Cause]:
        """After reporting a failure: the service decides the root cause (it may
        wait for a better one than an echo); hear it."""
        began = time.monotonic()
        with self._news:
            while self.cause is None and time.monotonic() < began + seconds and not self._closing.is_set():
                self._news.wait(0.05)
        _log.debug("node %d: %s after %.3fs", self.node_index, "verdict heard" if self.cause else "no verdict",
                   time.monotonic() - began)
        return self.cause

    def leave(self, calls: int, ok: bool) -> None:
        """This node's step ended; from now on its silence means nothing."""
        self._left = True
        self._safe_send(msg.Leave(calls, ok))
        _log.debug("node %d: left after %d calls (%s)", self.node_index, calls, "ok" if ok else "failed")

    def wait_all_left(self) -> bool:
        """The control's service must outlive every node's step."""
        while not self.all_left.wait(0.1):
            if self.cause is not None or self._closing.is_set():
                return False
        return True

    # -- threads ---------------------------------------------------------

    def _set_cause(self, cause: Cause) -> None:
        with self._news:
            if self.cause is not None:
                return
            self.cause = cause
            self._news.notify_all()
        _log.debug("node %d: the gang's verdict: %s: %s", self.node_index, cause.kind.value, cause.summary)
        try:
            self.on_abort(cause)
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
        assert sock is not None
        reader = wire.LineReader()
        sock.settimeout(self.config.heartbeat_interval)
        last_heard = time.monotonic()
        data: Optional[bytes] = self._early
        while not self._closing.is_set():
            if data:
                last_heard = time.monotonic()
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
                    self._set_cause(
                        Cause(
                            CauseKind.CONTROL_LOST,
                            "lost the connection to the control node (node 0): its task died "
                            "or was killed",
                            node_index=0,
                        )
                    )
                return
            silent = time.monotonic() - last_heard
            if silent > self.config.heartbeat_timeout:
                self._set_cause(
                    Cause(
                        CauseKind.CONTROL_UNRESPONSIVE,
                        "heard nothing from the control node (node 0) for %.0fs "
                        "(heartbeat_timeout=%gs): frozen or cut off from the network"
                        % (silent, self.config.heartbeat_timeout),
                        node_index=0,
                    )
                )
                return

    def _on_message(self, line: wire.Message) -> None:
        """What the service says; a line this client cannot read is skipped
        (the service was authenticated at the handshake)."""
        try:
            message = msg.parse(line)
        except wire.ProtocolError:
            return
        if isinstance(message, msg.Abort):
            self._set_cause(message.cause)
        elif isinstance(message, msg.AllLeft):
            self.all_left.set()
        elif isinstance(message, (msg.Go, msg.CallAllDone)):
            with self._news:
                if isinstance(message, msg.Go):
                    self._go[message.index] = message.rdzv_port
                else:
                    self._calls_done.add(message.index)
                self._news.notify_all()

    def _beat_loop(self) -> None:
        while not self._closing.wait(self.config.heartbeat_interval):
            if self._left and self.cause is not None:
                return
            self._safe_send(self._heartbeat())

    def _heartbeat(self) -> msg.Heartbeat:
        quiet = None
        try:
            quiet = self.quiet() if self.quiet is not None else None
        except Exception:
            pass
        return msg.Heartbeat(None if quiet is None else max(0.0, float(quiet)))
