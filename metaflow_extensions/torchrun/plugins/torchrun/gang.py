"""Cross-node liveness: every node learns within seconds that the gang is over.

torchrun's agent watches only its own node: when a node dies, its peers wait for
an NCCL or gloo timeout (10 to 30 minutes). Here the control task hosts a small
TCP service that every node (itself included) keeps one connection to:

- a node that reports a failed torchrun, or whose connection drops before it
  reported success (its task died), aborts the gang at once: the kernel closes
  a dead process's sockets, so no timeout is involved;
- a node that stops sending heartbeats (frozen, partitioned) aborts the gang
  after ``heartbeat_timeout``; nodes that stop hearing from the control abort
  themselves after the same time;
- nodes that have not joined after ``start_timeout`` abort the gang, named.

The first such event is the root cause; every node is told it and stops its
torchrun. Only the control's address is known to all nodes, so this works the
same locally, on Kubernetes and on AWS Batch. Messages are JSON lines.
"""

from __future__ import annotations

import base64
import json
import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Set

PROTOCOL = 1


@dataclass
class GangConfig:
    gang_id: str
    num_nodes: int
    heartbeat_timeout: float = 30.0
    start_timeout: float = 600.0
    # How often the control says who is still missing while nodes join.
    progress_interval: float = 15.0
    # A node whose ranks failed only because a peer went away (a closed gloo or
    # NCCL connection) often reports before the node where the real failure
    # happened: its report is held this long for a better root cause.
    secondary_grace: float = 1.5

    @property
    def heartbeat_interval(self) -> float:
        return max(0.05, min(1.0, self.heartbeat_timeout / 10.0))


def _send(sock: socket.socket, message: Dict[str, Any]) -> None:
    sock.sendall((json.dumps(message) + "\n").encode())


class _LineReader:
    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, data: bytes) -> List[Dict[str, Any]]:
        self.buffer += data
        out = []
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict):  # anything else is not our protocol
                out.append(message)
        return out


@dataclass
class _Peer:
    sock: socket.socket
    reader: _LineReader = field(default_factory=_LineReader)
    node: Optional[int] = None
    info: Dict[str, Any] = field(default_factory=dict)
    last_seen: float = field(default_factory=time.monotonic)


class GangServer:
    """Runs in the control task; one thread, one selector, no dependencies."""

    def __init__(
        self,
        config: GangConfig,
        host: str,
        ports: Sequence[int],
        announce: Optional[Dict[str, Any]] = None,
    ):
        """Listen on the first of ``ports`` that is free on this host; every
        node is told ``announce`` (e.g. torchrun's rendezvous port) on joining."""
        self.config = config
        self.announce = dict(announce or {})
        self.listener = _listen(host, ports, backlog=max(16, 2 * config.num_nodes))
        self.port = self.listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.listener, selectors.EVENT_READ)
        self._peers: Dict[socket.socket, _Peer] = {}
        self._by_node: Dict[int, _Peer] = {}
        self.joined_at: Dict[int, float] = {}
        self.done: Set[int] = set()
        self.cause: Optional[Dict[str, Any]] = None
        # A secondary failure held back for ``secondary_grace``: (cause, deadline).
        self._pending: Optional[tuple] = None
        # Rank 0's pickled return value (function entrypoints), from whichever
        # node ran rank 0: the control must always be able to return it.
        self.rank0_pickle: Optional[bytes] = None
        # What each node said about itself when it finished (ranks, last lines),
        # and when: the control's card shows the whole gang from these.
        self.reports: Dict[int, Dict[str, Any]] = {}
        self.finished_at: Dict[int, float] = {}
        self._started = time.monotonic()
        self._last_progress = self._started
        self._said_waiting = False
        self.progress: Callable[[str], None] = lambda text: None
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="torchrun-gang-server", daemon=True)

    def start(self) -> "GangServer":
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        self._thread.join(timeout=5)
        for peer in list(self._peers.values()):
            _close(peer.sock)
        _close(self.listener)
        self._selector.close()

    def missing(self) -> List[int]:
        return [n for n in range(self.config.num_nodes) if n not in self.joined_at]

    # -- the loop --------------------------------------------------------

    def _loop(self) -> None:
        interval = self.config.heartbeat_interval
        next_beat = 0.0
        while not self._closing.is_set():
            for key, _ in self._selector.select(timeout=interval / 2):
                if key.fileobj is self.listener:
                    self._accept()
                else:
                    self._receive(key.fileobj)  # type: ignore[arg-type]
            now = time.monotonic()
            if now >= next_beat:
                self._broadcast({"type": "hb"})
                next_beat = now + interval
            self._check_timeouts(now)
            self._report_progress(now)

    def _report_progress(self, now: float) -> None:
        """While nodes join, say who is there and who is missing, at a calm rate."""
        if self.cause is not None:
            return
        missing = self.missing()
        n = self.config.num_nodes
        if not missing:
            if self._said_waiting:
                self._said_waiting = False
                self.progress("all %d nodes joined after %.0f s" % (n, now - self._started))
            return
        if now - self._last_progress >= self.config.progress_interval:
            self._last_progress = now
            self._said_waiting = True
            self.progress(
                "waiting for nodes: %d/%d joined; node%s %s missing for %.0f s"
                % (
                    n - len(missing),
                    n,
                    "s" if len(missing) > 1 else "",
                    ", ".join(str(m) for m in missing),
                    now - self._started,
                )
            )

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        sock.setblocking(True)
        sock.settimeout(5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._peers[sock] = _Peer(sock)
        self._selector.register(sock, selectors.EVENT_READ)

    def _drop(self, peer: _Peer) -> None:
        try:
            self._selector.unregister(peer.sock)
        except (KeyError, ValueError):
            pass
        self._peers.pop(peer.sock, None)
        _close(peer.sock)
        if peer.node is not None and self._by_node.get(peer.node) is peer:
            del self._by_node[peer.node]
            reported = peer.node in self.finished_at  # it said why it ended
            if peer.node not in self.done and not reported and self.cause is None:
                self._abort(
                    {
                        "kind": "node_lost",
                        "node_index": peer.node,
                        "summary": "node %d (%s) disconnected before its torchrun finished: "
                        "its task died or was killed" % (peer.node, peer.info.get("host", "?")),
                    }
                )

    def _receive(self, sock: socket.socket) -> None:
        peer = self._peers.get(sock)
        if peer is None:
            return
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._drop(peer)
            return
        peer.last_seen = time.monotonic()
        for message in peer.reader.feed(data):
            self._handle(peer, message)

    def _handle(self, peer: _Peer, message: Dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "hello":
            if message.get("gang_id") != self.config.gang_id or message.get("protocol") != PROTOCOL:
                self._reply(peer, {"type": "reject", "reason": "another gang (%s)" % self.config.gang_id})
                self._drop_quietly(peer)
                return
            try:
                node = int(message["node_index"])
            except (KeyError, TypeError, ValueError):
                self._drop_quietly(peer)
                return
            if not 0 <= node < self.config.num_nodes:
                self._reply(peer, {"type": "reject", "reason": "no node %r in this gang" % node})
                self._drop_quietly(peer)
                return
            previous = self._by_node.get(node)
            if previous is not None and previous is not peer:
                self._drop_quietly(previous)  # a reconnect after a transient error
            peer.node = node
            peer.info = message
            self._by_node[node] = peer
            self.joined_at.setdefault(node, time.time())
            self._reply(peer, {"type": "welcome", "cause": self.cause, "announce": self.announce})
            self._broadcast({"type": "joined", "nodes": sorted(self.joined_at)})
        elif kind == "failed" and peer.node is not None:
            self._keep_report(peer.node, message)
            if self.cause is None:
                cause = dict(message.get("cause") or {})
                cause.setdefault("node_index", peer.node)
                cause["kind"] = "failed"
                if not cause.get("secondary"):
                    self._abort(cause)
                elif self._pending is None:
                    cause.setdefault("time", time.time())
                    self._pending = (cause, time.monotonic() + self.config.secondary_grace)
        elif kind == "done" and peer.node is not None:
            self._keep_report(peer.node, message)
            if message.get("rank0") is not None:
                self.rank0_pickle = base64.b64decode(message["rank0"])
            self.done.add(peer.node)
            if len(self.done) == self.config.num_nodes:
                self._broadcast({"type": "all_done"})

    def _keep_report(self, node: int, message: Dict[str, Any]) -> None:
        self.finished_at[node] = time.time()
        if isinstance(message.get("report"), dict):
            self.reports[node] = message["report"]

    def _drop_quietly(self, peer: _Peer) -> None:
        if peer.node is not None and self._by_node.get(peer.node) is peer:
            del self._by_node[peer.node]
        peer.node = None
        self._drop(peer)

    def _check_timeouts(self, now: float) -> None:
        if self.cause is not None:
            return
        if self._pending is not None and now >= self._pending[1]:
            self._abort(self._pending[0])  # no better cause came: the echo it is
            return
        missing = self.missing()
        if missing and now - self._started > self.config.start_timeout:
            self._abort(
                {
                    "kind": "never_joined",
                    "missing": missing,
                    "summary": "node%s %s did not join within %gs (%d of %d joined)"
                    % (
                        "s" if len(missing) > 1 else "",
                        ", ".join(str(n) for n in missing),
                        self.config.start_timeout,
                        self.config.num_nodes - len(missing),
                        self.config.num_nodes,
                    ),
                }
            )
            return
        for node, peer in list(self._by_node.items()):
            if node in self.done:
                continue
            silent = now - peer.last_seen
            if silent > self.config.heartbeat_timeout:
                self._abort(
                    {
                        "kind": "unresponsive",
                        "node_index": node,
                        "summary": "node %d (%s) sent no heartbeat for %.0fs (heartbeat_timeout=%gs): "
                        "frozen or cut off from the network"
                        % (node, peer.info.get("host", "?"), silent, self.config.heartbeat_timeout),
                    }
                )
                return

    def _abort(self, cause: Dict[str, Any]) -> None:
        cause.setdefault("time", time.time())
        self._pending = None
        self.cause = cause
        self._broadcast({"type": "abort", "cause": cause})

    def _reply(self, peer: _Peer, message: Dict[str, Any]) -> None:
        try:
            _send(peer.sock, message)
        except OSError:
            pass

    def _broadcast(self, message: Dict[str, Any]) -> None:
        for peer in list(self._by_node.values()):
            try:
                _send(peer.sock, message)
            except OSError:
                # A peer we cannot write to is treated like one that hung up.
                self._drop(peer)


class GangClient:
    """Runs on every node (the control included): heartbeats out, news in."""

    def __init__(self, config: GangConfig, host: str, ports: Sequence[int], node_index: int):
        self.config = config
        self.host = host
        self.ports = tuple(ports)
        self.port: Optional[int] = None
        self.node_index = node_index
        self.announce: Dict[str, Any] = {}
        self.cause: Optional[Dict[str, Any]] = None
        self.joined: List[int] = []
        self.all_done = threading.Event()
        self._aborted = threading.Event()
        self._sock: Optional[socket.socket] = None
        self._send_lock = threading.Lock()
        self._closing = threading.Event()
        self._finished = False
        self._threads: List[threading.Thread] = []

    # -- lifecycle -------------------------------------------------------

    def connect(self, give_up_after: Optional[float] = None) -> None:
        """Connect and say hello, retrying while the control is not up yet: nodes
        start in any order (on Kubernetes workers often start first)."""
        patience = give_up_after if give_up_after is not None else self.config.start_timeout
        deadline = time.monotonic() + patience
        last_error: Optional[BaseException] = None
        while time.monotonic() < deadline and not self._closing.is_set():
            for port in self.ports:
                try:
                    self._handshake(port)
                    break
                except (OSError, ValueError, RuntimeError) as e:
                    last_error = e
            if self._sock is not None:
                break
            time.sleep(0.2)
        if self._sock is None:
            self._set_cause(
                {
                    "kind": "control_unreachable",
                    "summary": "could not reach the control node's gang service at %s "
                    "(port %s) within %gs (last error: %s)"
                    % (self.host, " or ".join(map(str, self.ports)), patience, last_error),
                }
            )
            return
        for target, name in ((self._read_loop, "reader"), (self._beat_loop, "heartbeat")):
            t = threading.Thread(target=target, name="torchrun-gang-" + name, daemon=True)
            t.start()
            self._threads.append(t)

    def _handshake(self, port: int) -> None:
        """Say hello on ``port``; a port held by anything but our gang (another
        gang's service, an unrelated server) fails here and the next is tried."""
        sock = socket.create_connection((self.host, port), timeout=2)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _send(
                sock,
                {
                    "type": "hello",
                    "protocol": PROTOCOL,
                    "gang_id": self.config.gang_id,
                    "node_index": self.node_index,
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                },
            )
            sock.settimeout(2)
            reply = self._read_one(sock)
        except BaseException:
            _close(sock)
            raise
        if not isinstance(reply, dict) or reply.get("type") != "welcome":
            _close(sock)
            reason = reply.get("reason", "rejected") if isinstance(reply, dict) else "not a gang service"
            raise RuntimeError(reason)
        sock.settimeout(None)
        self._sock = sock
        self.port = port
        self.announce = dict(reply.get("announce") or {})
        if reply.get("cause"):
            self._set_cause(reply["cause"])

    def close(self) -> None:
        self._closing.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            _close(self._sock)
        for t in self._threads:
            t.join(timeout=2)

    # -- what the supervisor asks ----------------------------------------

    def abort_reason(self) -> Optional[str]:
        """For ``Supervisor.wait(should_stop=...)``."""
        if self.cause is None:
            return None
        return self.cause.get("summary") or self.cause.get("kind") or "gang aborted"

    def report_failure(self, cause: Dict[str, Any], report: Optional[Dict[str, Any]] = None) -> None:
        self._finished = True
        self._safe_send({"type": "failed", "cause": cause, "report": report})

    def report_done(
        self, rank0_pickle: Optional[bytes] = None, report: Optional[Dict[str, Any]] = None
    ) -> None:
        self._finished = True
        payload = base64.b64encode(rank0_pickle).decode() if rank0_pickle is not None else None
        self._safe_send({"type": "done", "rank0": payload, "report": report})

    def wait_all_done(self, timeout: float) -> bool:
        """The control hosts the service: it stays until every node reported, or
        the gang aborted, or ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.all_done.wait(0.1) or self.cause is not None:
                break
        return self.all_done.is_set()

    # -- threads ---------------------------------------------------------

    def _set_cause(self, cause: Dict[str, Any]) -> None:
        if self.cause is None:
            self.cause = cause
            self._aborted.set()

    def _safe_send(self, message: Dict[str, Any]) -> None:
        sock = self._sock
        if sock is None:
            return
        with self._send_lock:
            try:
                _send(sock, message)
            except OSError:
                pass

    def _read_one(self, sock: socket.socket) -> Dict[str, Any]:
        data = b""
        while b"\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                raise ValueError("connection closed during hello")
            data += chunk
        line, rest = data.split(b"\n", 1)
        self._pending = rest
        return json.loads(line)

    def _read_loop(self) -> None:
        assert self._sock is not None
        reader = _LineReader()
        pending = getattr(self, "_pending", b"")
        self._sock.settimeout(self.config.heartbeat_interval)
        last_heard = time.monotonic()
        messages = reader.feed(pending)
        while not self._closing.is_set():
            for message in messages:
                self._on_message(message)
            messages = []
            try:
                data = self._sock.recv(65536)
            except socket.timeout:
                data = None
            except OSError:
                data = b""
            now = time.monotonic()
            if data:
                last_heard = now
                messages = reader.feed(data)
                continue
            if self._closing.is_set() or self.all_done.is_set():
                return
            if data == b"":
                if not self._finished:
                    self._set_cause(
                        {
                            "kind": "control_lost",
                            "node_index": 0,
                            "summary": "lost the connection to the control node (node 0): "
                            "its task died or was killed",
                        }
                    )
                return
            if now - last_heard > self.config.heartbeat_timeout:
                self._set_cause(
                    {
                        "kind": "control_unresponsive",
                        "node_index": 0,
                        "summary": "heard nothing from the control node (node 0) for %.0fs "
                        "(heartbeat_timeout=%gs): frozen or cut off from the network"
                        % (now - last_heard, self.config.heartbeat_timeout),
                    }
                )
                return

    def _on_message(self, message: Dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "abort":
            self._set_cause(message.get("cause") or {"kind": "aborted"})
        elif kind == "joined":
            self.joined = list(message.get("nodes") or [])
        elif kind == "all_done":
            self.all_done.set()

    def _beat_loop(self) -> None:
        while not self._closing.wait(self.config.heartbeat_interval):
            if self.cause is not None and self._finished:
                return
            self._safe_send({"type": "hb"})


def _listen(host: str, ports: Sequence[int], backlog: int) -> socket.socket:
    errors = []
    for port in ports:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(backlog)
        except OSError as e:
            _close(sock)
            errors.append("%d: %s" % (port, e.strerror or e))
            continue
        sock.setblocking(False)
        return sock
    raise OSError("no port free for the gang service on %s (%s)" % (host or "*", "; ".join(errors)))


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
