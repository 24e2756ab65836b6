"""The gang service: one thread in the control task that every node of the step
keeps one connection to, from the first line of its step to the last.

What it decides, and why it can: it is the one place that sees every node.

- A node whose connection drops before it left its step died: the gang stops
  at once (the kernel closes a dead process's sockets; no timeout involved).
- A node that sends nothing for ``heartbeat_timeout`` is frozen or cut off.
- Nodes missing after ``start_timeout`` never started.
- A node that reports a failure (its step raised, or its ranks failed) is the
  root cause, unless it is an echo of another failure (held ``secondary_grace``
  in case the real one follows).
- ``current.torch.run`` calls are matched across nodes: a node starts call k
  as soon as it and node 0 (the rendezvous store's host) have entered it, with
  the call's own rendezvous port, unless its entrypoint differs from a node
  already there; a node that does not reach a call within ``start_timeout``,
  or ends its step while others are in a call it never made, is named.

Who may speak: only a peer that proved it holds the gang's secret
(``gang_auth``), and then only for the node index it proved; until then it is
a stranger with a tiny line limit, ``HELLO_TIMEOUT`` to prove itself and one of
``MAX_PENDING`` places. A stranger that fails is told "not authenticated"
(nothing about the gang) and changes nothing. A peer that breaks a rule (a line
that is not JSON, a message out of turn, a field of the wrong type) is dropped:
never the service.
"""

from __future__ import annotations

import base64
import binascii
import selectors
import sys
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from . import auth as gang_auth
from . import wire
from ..rank import stacks as rank_stacks
from ..cause import Cause, CauseKind, plural
from .config import RDZV_STORE_NODE, GangConfig
from .ports import find_free_port

# Connections that have not proved themselves yet, at most: past that, the
# oldest is dropped for the newcomer (a slow stranger cannot keep a real node
# out by holding every place).
MAX_PENDING = 64
# A connection must say hello within this many seconds.
HELLO_TIMEOUT = 5.0
# After accept() fails (EMFILE), wait this long before accepting again.
ACCEPT_BACKOFF = 0.5


@dataclass
class _Peer:
    sock: socket.socket
    nonce: bytes = field(default_factory=gang_auth.new_nonce)
    reader: wire.LineReader = field(
        default_factory=lambda: wire.LineReader(max_line=wire.PRE_AUTH_LINE, strict=True))
    node: Optional[int] = None  # set once the peer proved it holds the secret
    host: str = "?"
    connected: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    # When this node's ranks last wrote output (monotonic, this host's clock),
    # from its heartbeats while a call runs; None outside a call's job.
    last_output: Optional[float] = None


@dataclass
class CallState:
    """One ``current.torch.run`` call as the gang sees it."""

    index: int
    entries: Dict[int, str] = field(default_factory=dict)  # node -> entrypoint name
    rdzv_port: Optional[int] = None
    first_entered: float = field(default_factory=time.monotonic)
    done: Set[int] = field(default_factory=set)
    reports: Dict[int, Dict[str, Any]] = field(default_factory=dict)
    finished_at: Dict[int, float] = field(default_factory=dict)
    # Rank 0's return value (pickled by the node that ran rank 0), kept only
    # once its MAC checked out; ``rank0_error`` says why a value is missing.
    rank0: Optional[bytes] = None
    rank0_node: Optional[int] = None
    rank0_error: Optional[str] = None
    # When the last node entered (monotonic): the call's rendezvous can only
    # complete after it, so hang detection and call timeouts count from here.
    all_entered_at: Optional[float] = None
    went: Set[int] = field(default_factory=set)  # the nodes told to launch
    # After a failure: each node's ranks' stacks (node -> rank -> text), sent
    # once per node (an empty dict from a node with no live rank to stop).
    stacks: Dict[int, Dict[int, str]] = field(default_factory=dict)


class GangServer:
    """Runs in the control task; one thread, one selector, no dependencies."""

    def __init__(self, config: GangConfig, host: str, ports: Sequence[int], secret: Optional[bytes] = None):
        """Listen on the first of ``ports`` that is free on ``host``. ``secret``:
        the gang's (``secret.py``); None is TRANSITIONAL (see
        ``gang_auth.transitional_secret``) until session.py passes it."""
        self.config = config
        self.host = host
        self._secret = gang_auth.check_secret(
            secret if secret is not None else gang_auth.transitional_secret(config.gang_id))
        self.rejected = 0  # strangers that failed the handshake
        # A deep backlog: a flood of strangers fills it, not the nodes' way in.
        self.listener = _listen(host, ports, backlog=max(MAX_PENDING * 2, 2 * config.num_nodes))
        self.port: int = self.listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.listener, selectors.EVENT_READ)
        # close() wakes the loop through this pair rather than waiting out a
        # select timeout: the control's step ends up to half a second sooner.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._peers: Dict[socket.socket, _Peer] = {}
        self._by_node: Dict[int, _Peer] = {}
        self.joined_at: Dict[int, float] = {}
        self.left: Dict[int, Tuple[int, bool]] = {}  # node -> (calls made, ok)
        self.node_calls: Dict[int, int] = {}  # node -> calls entered so far
        self.calls: Dict[int, CallState] = {}
        self.cause: Optional[Cause] = None
        self._pending: Optional[Tuple[Cause, float]] = None  # an echo, held
        self._started = time.monotonic()
        self._last_progress = self._started
        self._said_waiting = False
        self._accept_paused_until = 0.0
        self.progress: Callable[[str], None] = lambda text: None
        # Said once per gang: someone without the secret tried to join.
        self.warn: Callable[[str], None] = lambda text: print("@torchrun: " + text, file=sys.stderr, flush=True)
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="torchrun-gang-server", daemon=True)

    def start(self) -> "GangServer":
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for peer in list(self._peers.values()):
            wire.close_quietly(peer.sock)
        for sock in (self.listener, self._wake_r, self._wake_w):
            wire.close_quietly(sock)
        self._selector.close()

    def missing(self) -> List[int]:
        return [n for n in range(self.config.num_nodes) if n not in self.joined_at]

    def everyone_heard(self) -> bool:
        """After an abort: every node was told the cause, as it happened (it was
        connected then) or as it joined. A node cut off since is not waited for."""
        return not self.missing()

    # -- the loop --------------------------------------------------------

    def _loop(self) -> None:
        interval = self.config.heartbeat_interval
        next_beat = 0.0
        while not self._closing.is_set():
            try:
                next_beat = self._turn(interval, next_beat)
            except Exception as e:  # the service outlives any bug of its own
                self.warn("gang service: %s: %s" % (type(e).__name__, e))
                self._closing.wait(interval / 2)

    def _turn(self, interval: float, next_beat: float) -> float:
        """One turn of the loop; returns when the next heartbeat is due."""
        for key, _ in self._selector.select(timeout=interval / 2):
            if key.fileobj is self.listener:
                self._accept()
            elif key.fileobj is self._wake_r:
                return next_beat  # closing
            else:
                self._receive(key.fileobj)  # type: ignore[arg-type]
        now = time.monotonic()
        if now >= self._accept_paused_until > 0:
            self._accept_paused_until = 0.0
            self._selector.register(self.listener, selectors.EVENT_READ)
        if now >= next_beat:
            self._broadcast({"type": "hb"})
            next_beat = now + interval
        self._check_timeouts(now)
        self._report_progress(now)
        return next_beat

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            # Out of file descriptors (EMFILE) leaves the connection queued and
            # the listener readable: pause instead of spinning on it.
            self._selector.unregister(self.listener)
            self._accept_paused_until = time.monotonic() + ACCEPT_BACKOFF
            return
        strangers = [p for p in self._peers.values() if p.node is None]
        if len(strangers) >= MAX_PENDING:
            self._drop(min(strangers, key=lambda p: p.connected))
        sock.setblocking(True)
        sock.settimeout(5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = _Peer(sock)
        self._peers[sock] = peer
        self._selector.register(sock, selectors.EVENT_READ)
        try:
            wire.send(sock, gang_auth.challenge(peer.nonce))
        except OSError:
            self._drop(peer)

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
        try:
            messages = peer.reader.feed(data)
        except wire.ProtocolError:
            self._drop(peer)
            return
        for message in messages:
            if peer.sock not in self._peers:
                return
            try:
                self._handle(peer, message)
            except Exception:  # a malformed message costs its sender, not the gang
                self._drop(peer)
                return

    # -- messages ---------------------------------------------------------

    def _handle(self, peer: _Peer, message: wire.Message) -> None:
        kind = message.get("type")
        if peer.node is None:
            self._on_hello(peer, message)
            return
        if peer.node in self.left and kind not in ("hb", "stacks"):
            self._drop(peer)  # a node that left has nothing more to say
            return
        handler = {
            "hb": self._on_heartbeat,
            "stacks": self._on_stacks,
            "call": self._on_call,
            "call_done": self._on_call_done,
            "failed": self._on_failed,
            "leave": self._on_leave,
        }.get(kind)  # type: ignore[arg-type]
        if handler is None:
            self._drop(peer)
            return
        handler(peer, message)

    def _on_hello(self, peer: _Peer, message: wire.Message) -> None:
        """The stranger's one chance: a hello that proves the secret."""
        try:
            node, client_nonce = gang_auth.check_hello(
                self._secret, self.config.gang_id, peer.nonce, message, self.config.num_nodes)
        except gang_auth.AuthError as e:
            self.rejected += 1
            if self.rejected == 1:
                self.warn(
                    "a connection to the gang service from %s did not prove it holds the gang's secret "
                    "(%s): turned away (said once; another gang's node, or someone probing the port)"
                    % (_address(peer.sock), e))
            self._reply(peer, {"type": "reject", "reason": "not authenticated"})
            self._drop(peer)
            return
        if node in self._by_node or node in self.left:
            # A node index is held by one connection for the whole step.
            self._reply(peer, {"type": "reject", "reason": "node %d is taken" % node})
            self._drop(peer)
            return
        peer.node = node
        peer.host = wire.str_field(message, "host", 255) or "?"
        peer.reader.max_line = wire.MAX_LINE
        self._by_node[node] = peer
        self.joined_at.setdefault(node, time.time())
        cause = self.cause.to_wire() if self.cause else None
        self._reply(peer, gang_auth.welcome(self._secret, self.config.gang_id, peer.nonce, client_nonce, node,
                                            cause=cause))
        self._broadcast({"type": "joined", "nodes": sorted(self.joined_at)})

    def _on_call(self, peer: _Peer, message: wire.Message) -> None:
        node = peer.node
        assert node is not None
        index = wire.int_field(message, "index")
        entry = wire.str_field(message, "entry") or "?"
        if index is None or index != self.node_calls.get(node, 0):
            self._drop(peer)
            return
        self.node_calls[node] = index + 1
        call = self.calls.setdefault(index, CallState(index))
        call.entries[node] = entry
        if self.cause is not None:
            return
        others = {e for n, e in call.entries.items() if n != node}
        if others and entry not in others:
            first = min(n for n in call.entries if n != node)
            self._abort(_mismatch(index, node, entry, first, call.entries[first]))
            return
        for other, (made, ok) in sorted(self.left.items()):
            if ok and made <= index:
                self._abort(_left_early(other, made, node, index))
                return
        self._send_go(call)
        if len(call.entries) == self.config.num_nodes and call.all_entered_at is None:
            call.all_entered_at = time.monotonic()

    def _send_go(self, call: CallState) -> None:
        """Node 0 launches as soon as it arrives, and every other node as soon
        as it and node 0 are there: torchrun's start (its ``import torch``)
        overlaps the later nodes' start, and the rendezvous waits for them
        (command.join_timeout). Not before node 0: it hosts the rendezvous
        store, which another node's torchrun stops looking for after torch's
        ``read_timeout`` (60 s). A node that never arrives is the gang's call
        timeout, not torch's."""
        if RDZV_STORE_NODE not in call.entries:
            return
        if call.rdzv_port is None:
            call.rdzv_port = find_free_port(self.host)
        message = {"type": "go", "index": call.index, "rdzv_port": call.rdzv_port}
        for node in sorted(call.entries):
            peer = self._by_node.get(node)
            if node not in call.went and peer is not None:
                call.went.add(node)
                self._reply(peer, message)

    def _on_heartbeat(self, peer: _Peer, message: wire.Message) -> None:
        quiet = message.get("quiet")
        if quiet is None:
            peer.last_output = None
        elif isinstance(quiet, (int, float)) and not isinstance(quiet, bool) and 0 <= quiet < 1e9:
            peer.last_output = time.monotonic() - float(quiet)
        else:
            self._drop(peer)

    def _on_stacks(self, peer: _Peer, message: wire.Message) -> None:
        """Where a node's ranks were when it stopped them: kept once per node
        and call, for the control's report; never acted on."""
        node = peer.node
        assert node is not None
        index = wire.int_field(message, "call")
        call = self.calls.get(index) if index is not None else None
        if call is None or node not in call.entries or node in call.stacks:
            self._drop(peer)
            return
        call.stacks[node] = rank_stacks.parse_wire(message.get("stacks"))

    def stacks_pending(self, index: int) -> List[int]:
        """Nodes of call ``index`` that may still send their stacks: in the
        call and not done with it, connected, not gone (a node sends its stacks
        before it leaves), and silent about them so far."""
        call = self.calls.get(index)
        if call is None:
            return []
        return sorted(n for n in list(call.entries) if n not in call.stacks and n not in call.done
                      and n not in self.left and n in self._by_node)

    def _on_call_done(self, peer: _Peer, message: wire.Message) -> None:
        node = peer.node
        assert node is not None
        index = wire.int_field(message, "index")
        call = self.calls.get(index) if index is not None else None
        if call is None or node not in call.entries or node in call.done or call.all_entered_at is None:
            self._drop(peer)  # done with a call it never started, or twice
            return
        rank0 = message.get("rank0")
        if rank0 is not None:
            data = _base64(rank0)
            if data is None or not gang_auth.check_payload(
                    self._secret, self.config.gang_id, call.index, node, data, message.get("rank0_proof")):
                self._drop(peer)  # never kept, so never loaded
                return
            if call.rank0 is None:
                call.rank0, call.rank0_node = data, node
        size = wire.int_field(message, "rank0_size", 0, 1 << 62)
        if size is not None and call.rank0 is None:
            call.rank0_error = (
                "the return value of rank 0 (on node %d) is %d bytes pickled, over the %d bytes the gang "
                "carries: return something smaller, or save it (an artifact, S3) and return where it is"
                % (node, size, wire.RANK0_MAX))
        self._keep_report(call, node, message)
        call.done.add(node)
        if len(call.done) == self.config.num_nodes:
            self._broadcast({"type": "call_all_done", "index": index})

    def _on_failed(self, peer: _Peer, message: wire.Message) -> None:
        node = peer.node
        assert node is not None
        cause = Cause.from_wire(message.get("cause"))
        index = wire.int_field(message, "call")
        if index is not None and index in self.calls:
            self._keep_report(self.calls[index], node, message)
        if cause is None or self.cause is not None:
            return
        cause = cause.with_node(node)
        if not cause.secondary:
            self._abort(cause)
        elif self._pending is None:
            self._pending = (cause, time.monotonic() + self.config.secondary_grace)

    def _on_leave(self, peer: _Peer, message: wire.Message) -> None:
        node = peer.node
        assert node is not None
        made = wire.int_field(message, "calls")
        ok = message.get("ok") is True
        if made is None or made != self.node_calls.get(node, 0):
            made = self.node_calls.get(node, 0)
        self.left[node] = (made, ok)
        if self.cause is None:
            if not ok:
                self._abort(Cause(CauseKind.STEP_FAILED, "node %d ended its step with an error" % node,
                                  node_index=node))
            else:
                self._check_left(node, made)
        if len(self.left) == self.config.num_nodes:
            self._broadcast({"type": "all_left"})

    def _check_left(self, node: int, made: int) -> None:
        """A node that ended its step fine must have made the calls the others made."""
        for other in sorted(self.node_calls):
            if other != node and self.node_calls[other] > made:
                self._abort(_left_early(node, made, other, made))
                return
        for other, (their, ok) in sorted(self.left.items()):
            if other != node and ok and their != made:
                self._abort(
                    Cause(
                        CauseKind.CALL_MISMATCH,
                        "node %d made %d call%s of current.torch.run in its step and node %d "
                        "made %d: every node must make the same calls"
                        % (node, made, "" if made == 1 else "s", other, their),
                        node_index=node,
                    )
                )
                return

    def _keep_report(self, call: CallState, node: int, message: wire.Message) -> None:
        call.finished_at[node] = time.time()
        report = message.get("report")
        if isinstance(report, dict):
            call.reports[node] = report

    # -- timeouts and progress -------------------------------------------

    def _check_timeouts(self, now: float) -> None:
        for peer in [p for p in self._peers.values() if p.node is None]:
            if now - peer.connected > HELLO_TIMEOUT:
                self._drop(peer)
        if self.cause is not None:
            return
        if self._pending is not None and now >= self._pending[1]:
            self._abort(self._pending[0])  # no better cause came: the echo it is
            return
        missing = self.missing()
        if missing and now - self._started > self.config.start_timeout:
            self._abort(
                Cause(
                    CauseKind.NEVER_JOINED,
                    "%s did not join within %gs (%d of %d joined)"
                    % (plural(missing), self.config.start_timeout,
                       self.config.num_nodes - len(missing), self.config.num_nodes),
                    missing=tuple(missing),
                )
            )
            return
        for call in self.calls.values():
            if call.all_entered_at is None and now - call.first_entered > self.config.start_timeout:
                absent = [n for n in range(self.config.num_nodes) if n not in call.entries]
                self._abort(
                    Cause(
                        CauseKind.CALL_TIMEOUT,
                        "%s did not reach call %d of current.torch.run within %gs of node %d "
                        "(start_timeout): every node must make the same calls"
                        % (plural(absent), call.index + 1, self.config.start_timeout, min(call.entries)),
                        node_index=absent[0] if absent else None,
                        missing=tuple(absent),
                        call=call.index,
                    )
                )
                return
        if self._check_hang(now):
            return
        for node, peer in list(self._by_node.items()):
            silent = now - peer.last_seen
            if node not in self.left and silent > self.config.heartbeat_timeout:
                self._abort(
                    Cause(
                        CauseKind.UNRESPONSIVE,
                        "node %d (%s) sent no heartbeat for %.0fs (heartbeat_timeout=%gs): "
                        "frozen or cut off from the network"
                        % (node, peer.host, silent, self.config.heartbeat_timeout),
                        node_index=node,
                    )
                )
                return

    def _check_hang(self, now: float) -> bool:
        """``hang_timeout``: no rank of the running call wrote anything for that
        long, on any node still running it. A node's silence is measured on its
        own host and sent as a duration, so clocks need not agree."""
        limit = self.config.hang_timeout
        if not limit:
            return False
        for call in self.calls.values():
            if call.all_entered_at is None:
                continue
            running = [n for n in call.entries if n not in call.done and n not in self.left]
            if not running:
                continue
            latest = call.all_entered_at
            for node in running:
                peer = self._by_node.get(node)
                if peer is not None and peer.last_output is not None:
                    latest = max(latest, peer.last_output)
            if now - latest >= limit:
                self._abort(
                    Cause(
                        CauseKind.HANG,
                        "no output from any rank for %.0f s (hang_timeout=%gs), in call %d of "
                        "current.torch.run" % (now - latest, limit, call.index + 1),
                        call=call.index,
                    )
                )
                return True
        return False

    def _report_progress(self, now: float) -> None:
        """While nodes join or meet at a call, say who is missing, at a calm rate."""
        if self.cause is not None:
            return
        waiting = self._waiting_for(now)
        if not waiting:
            if self._said_waiting:
                self._said_waiting = False
                self.progress("all %d nodes are there" % self.config.num_nodes)
            return
        if now - self._last_progress >= self.config.progress_interval:
            self._last_progress = now
            self._said_waiting = True
            self.progress(waiting)

    def _waiting_for(self, now: float) -> Optional[str]:
        n = self.config.num_nodes
        missing = self.missing()
        if missing:
            return "waiting for nodes: %d/%d joined; %s missing for %.0f s" % (
                n - len(missing), n, plural(missing), now - self._started)
        for index in sorted(self.calls):
            call = self.calls[index]
            if call.all_entered_at is None:
                absent = [m for m in range(n) if m not in call.entries]
                return "call %d of current.torch.run (%s): waiting for %s to reach it for %.0f s" % (
                    index + 1, next(iter(call.entries.values())), plural(absent), now - call.first_entered)
        return None

    # -- ending ------------------------------------------------------------

    def _abort(self, cause: Cause) -> None:
        self._pending = None
        self.cause = cause
        self._broadcast({"type": "abort", "cause": cause.to_wire()})

    def _drop(self, peer: _Peer) -> None:
        try:
            self._selector.unregister(peer.sock)
        except (KeyError, ValueError):
            pass
        self._peers.pop(peer.sock, None)
        wire.close_quietly(peer.sock)
        node = peer.node
        if node is None or self._by_node.get(node) is not peer:
            return
        del self._by_node[node]
        if node in self.left or self.cause is not None:
            return
        if self._pending is not None and self._pending[0].node_index == node:
            return  # it reported an echo and exited: wait for the grace to decide
        self._abort(
            Cause(
                CauseKind.NODE_LOST,
                "node %d (%s) disconnected before its step ended: its task died or was killed"
                % (node, peer.host),
                node_index=node,
            )
        )

    def _reply(self, peer: _Peer, message: wire.Message) -> None:
        try:
            wire.send(peer.sock, message)
        except OSError:
            pass

    def _broadcast(self, message: wire.Message) -> None:
        data = wire.encode(message)
        for peer in list(self._by_node.values()):
            try:
                peer.sock.sendall(data)
            except OSError:
                # A peer we cannot write to is treated like one that hung up.
                self._drop(peer)


def _mismatch(index: int, node: int, entry: str, other: int, their: str) -> Cause:
    return Cause(
        CauseKind.CALL_MISMATCH,
        "call %d of current.torch.run differs between nodes: node %d runs %r, node %d runs %r; "
        "every node must make the same calls in the same order" % (index + 1, node, entry, other, their),
        node_index=node,
        call=index,
    )


def _left_early(node: int, made: int, waiting: int, index: int) -> Cause:
    return Cause(
        CauseKind.LEFT_EARLY,
        "node %d ended its step after %d call%s of current.torch.run while node %d waits in "
        "call %d: every node must make the same calls" % (
            node, made, "" if made == 1 else "s", waiting, index + 1),
        node_index=node,
        call=index,
    )


def _base64(value: Any) -> Optional[bytes]:
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def _address(sock: socket.socket) -> str:
    try:
        return "%s:%s" % sock.getpeername()[:2]
    except OSError:
        return "?"


def _listen(host: str, ports: Sequence[int], backlog: int) -> socket.socket:
    errors = []
    for port in ports:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(backlog)
        except OSError as e:
            wire.close_quietly(sock)
            errors.append("%d: %s" % (port, e.strerror or e))
            continue
        sock.setblocking(False)
        return sock
    raise OSError("no port free for the gang service on %s (%s)" % (host or "*", "; ".join(errors)))
