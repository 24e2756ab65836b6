"""Snapshots between two nodes' stores over TCP: a push to the buddy node, a fetch by a spare.

Both sides prove they hold the gang's secret before anything else (``gang/auth.py``'s proof,
with sides of their own, so a proof on the gang's port never passes here, nor the other way);
every frame after carries an HMAC under a key of this connection (both nonces), over its
sequence number and header. A snapshot's header names its SHA-256, computed by the sending store
as it sends (a rank's save computes none), so the bytes that follow are checked against an
authenticated digest: a copy that fails any check is dropped, its body never decoded. The bytes
go from the sender's slot to the receiver's with no buffer between. Nothing is unpickled; the
snapshot is the codec's bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from ...gang import auth
from ..rank import codec, wire
from .shelf import Shelf, Slot, Source, view

PROTOCOL = 2  # 2: a snapshot names the start that took it
HANDSHAKE_TIMEOUT = 5.0
IO_TIMEOUT = 60.0  # a snapshot of GBs on a slow link
Address = Tuple[str, int]
MAX_START = 1 << 31
Admits = Callable[[str], bool]  # whether a peer's copy of a key is taken (a shard of another world size is not)


class PeerRefused(ConnectionError):
    """The other store does not hold the gang's secret, or broke the protocol."""


@dataclass(frozen=True)
class PeerKey:
    """Who this store is to the gang: its secret, the gang's id, its node index."""

    secret: bytes
    gang_id: str
    node: int

    def __post_init__(self) -> None:
        auth.check_secret(self.secret)


class Channel:
    """One authenticated connection: every frame MACed under the connection's own key, in sequence."""

    def __init__(self, sock: socket.socket, key: PeerKey, server_nonce: bytes, client_nonce: bytes,
                 is_server: bool, peer_node: int) -> None:
        self.sock = sock
        self.peer_node = peer_node
        self.node = key.node
        base = auth.derive(key.secret, "snapshot frames")
        self._key = hmac.new(base, key.gang_id.encode() + b"\0" + server_nonce + client_nonce,
                             hashlib.sha256).digest()
        self._sent = self._received = 0
        self._out, self._in = (b"s", b"c") if is_server else (b"c", b"s")

    def _mac(self, side: bytes, seq: int, header: Dict[str, Any]) -> str:
        return hmac.new(self._key, side + seq.to_bytes(8, "big") + wire.header_bytes(header),
                        hashlib.sha256).hexdigest()

    def send(self, header: Dict[str, Any], body: Optional[Any] = None) -> None:
        signed = dict(header, mac=self._mac(self._out, self._sent, header))
        self._sent += 1
        wire.send_frame(self.sock, signed, body)

    def recv(self) -> Optional[Dict[str, Any]]:
        """The next header, its MAC checked; None at a clean close."""
        header = wire.recv_header(self.sock)
        if header is None:
            return None
        mac = header.pop("mac", None)
        if not isinstance(mac, str) or not hmac.compare_digest(mac, self._mac(self._in, self._received, header)):
            raise PeerRefused("a frame whose MAC does not hold: dropped")
        self._received += 1
        return header

    def recv_snapshot(self, header: Dict[str, Any], into: memoryview) -> None:
        """The body an authenticated header announced, into ``into`` (as long as the header's size); it
        counts only if its digest is the header's (``PeerRefused`` otherwise: drop what was written)."""
        size = len(into)
        digest = header.get("sha256")
        if not isinstance(digest, str) or len(digest) != 64:
            raise PeerRefused("a snapshot header with no digest")
        wire.recv_into(self.sock, into)
        actual = codec.digest_of(into, size).hex()
        if not (hmac.compare_digest(actual, digest) and hmac.compare_digest(actual, bytes(into[-32:]).hex())):
            raise PeerRefused("a snapshot whose bytes do not match its authenticated digest: dropped")

    def send_snapshot(self, slot: Slot) -> None:
        """A pinned slot's snapshot: its digest computed now, in the MACed header and as its trailer."""
        with view(slot) as body:
            digest = codec.digest_of(body, slot.size)
            self.send({"key": slot.key, "step": slot.step, "start": slot.start, "size": slot.size,
                       "sha256": digest.hex()})
            self.sock.sendall(body[:slot.size - codec.DIGEST_BYTES])
            self.sock.sendall(digest)

    def close(self) -> None:
        wire.close_quietly(self.sock)


def connect(key: PeerKey, address: Address, timeout: float = HANDSHAKE_TIMEOUT) -> Channel:
    """A channel to another node's store, which proved it holds the secret; ``PeerRefused`` otherwise."""
    try:
        sock = socket.create_connection(address, timeout=timeout)
    except OSError as e:
        raise PeerRefused("the store at %s:%d: %s" % (address[0], address[1], e)) from None
    try:
        hello = wire.recv_header(sock) or {}
        server_nonce = _nonce(hello.get("nonce"))
        if hello.get("snapshot") != PROTOCOL or server_nonce is None:
            raise PeerRefused("%s:%d is no snapshot store of this version" % address)
        client_nonce = auth.new_nonce()
        wire.send_frame(sock, {"node": key.node, "nonce": client_nonce.hex(),
                               "proof": _proof(key, "snapshot-client", server_nonce, client_nonce, key.node)})
        answer = wire.recv_header(sock) or {}
        expected = _proof(key, "snapshot-server", server_nonce, client_nonce, key.node)
        if not _same(expected, answer.get("proof")):
            raise PeerRefused("the store at %s:%d does not hold this gang's secret" % address)
        sock.settimeout(IO_TIMEOUT)
        return Channel(sock, key, server_nonce, client_nonce, is_server=False, peer_node=-1)
    except (OSError, wire.WireError) as e:
        wire.close_quietly(sock)
        raise PeerRefused("the store at %s:%d: %s" % (address[0], address[1], e)) from None
    except PeerRefused:
        wire.close_quietly(sock)
        raise


def accept(sock: socket.socket, key: PeerKey) -> Channel:
    """The server's side of ``connect``: the client's proof checked before it may send anything else."""
    sock.settimeout(HANDSHAKE_TIMEOUT)
    server_nonce = auth.new_nonce()
    wire.send_frame(sock, {"snapshot": PROTOCOL, "nonce": server_nonce.hex()})
    hello = wire.recv_header(sock) or {}
    node, client_nonce = hello.get("node"), _nonce(hello.get("nonce"))
    if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < wire.MAX_INDEX or not client_nonce:
        raise PeerRefused("a hello with no node or nonce")
    if not _same(_proof(key, "snapshot-client", server_nonce, client_nonce, node), hello.get("proof")):
        raise PeerRefused("a peer that does not hold the gang's secret")
    wire.send_frame(sock, {"proof": _proof(key, "snapshot-server", server_nonce, client_nonce, node)})
    sock.settimeout(IO_TIMEOUT)
    return Channel(sock, key, server_nonce, client_nonce, is_server=True, peer_node=node)


def _proof(key: PeerKey, side: str, server_nonce: bytes, client_nonce: bytes, node: int) -> str:
    return auth.proof(key.secret, side, key.gang_id, server_nonce, client_nonce, node)


def _same(expected: str, given: Any) -> bool:
    return isinstance(given, str) and len(given) == len(expected) and hmac.compare_digest(expected, given)


def _nonce(value: Any) -> Optional[bytes]:
    if not isinstance(value, str) or len(value) != 2 * len(auth.new_nonce()):
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return None


# -- the client's requests ------------------------------------------------------------


def push(channel: Channel, slot: Slot) -> Optional[str]:
    """None once the peer holds the (pinned) slot's snapshot; else the peer's reason (its budget)."""
    channel.send({"op": "push", "key": slot.key, "step": slot.step, "size": slot.size})
    answer = channel.recv() or {}
    if not answer.get("go"):
        return str(answer.get("why", "refused"))[:500]
    channel.send_snapshot(slot)
    done = channel.recv() or {}
    return None if done.get("ok") else str(done.get("why", "not kept"))[:500]


def fetch(channel: Channel, key: str, shelf: Shelf, index: int) -> Optional[int]:
    """Every snapshot the peer holds for ``key``, oldest first, each checked against its digest and kept on
    ``shelf`` as from ``(index, the peer's node)``, with the start that took it; that node, or None where the
    peer holds none."""
    channel.send({"op": "steps", "key": key})
    answer = channel.recv() or {}
    held, node = answer.get("held"), answer.get("node")
    if not isinstance(held, list) or len(held) > 8 or isinstance(node, bool) or not isinstance(node, int):
        raise PeerRefused("a steps answer that is not a short list and a node")
    for pair in held:
        if not isinstance(pair, list) or len(pair) != 2:
            raise PeerRefused("a steps answer whose snapshots are not (start, step)")
        start = wire.int_field({"start": pair[0]}, "start", 0, MAX_START)
        step = wire.int_field({"step": pair[1]}, "step", 0, 1 << 53)
        channel.send({"op": "fetch", "key": key, "step": step, "start": start})
        header = channel.recv() or {}
        if header.get("size") is None:
            continue  # dropped since it answered
        size = wire.int_field(header, "size", 64, 1 << 48)
        slot = shelf.begin(key, size)
        if slot is None:
            raise PeerRefused("a copy of %d bytes is over this node's snapshot budget (%d of %d bytes in use)"
                              % (size, shelf.used(), shelf.budget))
        _receive(channel, shelf, slot, key, header, (index, node))
    return node if held else None


def _receive(channel: Channel, shelf: Shelf, slot: Slot, key: str, header: Dict[str, Any],
             source: Optional[Source]) -> None:
    """An authenticated snapshot's body into ``slot``: kept only whole, of ``key``, matching its digest."""
    try:
        if header.get("key") != key:
            raise PeerRefused("a copy of another key than asked")
        step = wire.int_field(header, "step", 0, 1 << 53)
        start = wire.int_field(header, "start", 0, MAX_START)
        size = wire.int_field(header, "size", 64, slot.capacity)
        with memoryview(slot.map) as whole:
            channel.recv_snapshot(header, whole[:size])
    except BaseException:
        shelf.abandon(slot)
        raise
    shelf.finish(slot, step, size, source, start)


# -- the server's side ----------------------------------------------------------------


def serve(channel: Channel, shelf: Shelf, admits: Optional[Admits] = None) -> None:
    """Answer one authenticated peer until it closes; any broken frame ends the connection. ``admits``: whether
    a push of a key is taken (a shard of a world size the ranks left is refused)."""
    while True:
        header = channel.recv()
        if header is None:
            return
        op, key = header.get("op"), wire.key_field(header)
        if op == "push" and admits is not None and not admits(key):
            channel.send({"go": False, "why": "%s is of a gang size this node's ranks no longer train at" % key})
        elif op == "push":
            _take_push(channel, shelf, key, header)
        elif op == "steps":
            channel.send({"held": [list(h) for h in shelf.held(key)], "node": channel.node})
        elif op == "fetch":
            _send_copy(channel, shelf, key, wire.int_field(header, "step", 0, 1 << 53),
                       wire.int_field(header, "start", 0, MAX_START))
        else:
            raise PeerRefused("an unknown request")


def _send_copy(channel: Channel, shelf: Shelf, key: str, step: int, start: int) -> None:
    slot = shelf.pin(key, step, start)
    if slot is None:
        channel.send({"size": None})
        return
    try:
        channel.send_snapshot(slot)
    finally:
        shelf.unpin(slot)


def _take_push(channel: Channel, shelf: Shelf, key: str, header: Dict[str, Any]) -> None:
    """Room first (a slot, or ``go: false``), then the body under a MACed header that carries its digest."""
    size = wire.int_field(header, "size", 64, 1 << 48)
    slot = shelf.begin(key, size)
    if slot is None:
        channel.send({"go": False, "why": "over this node's snapshot budget (%d of %d bytes in use, %d asked)"
                      % (shelf.used(), shelf.budget, size)})
        return
    channel.send({"go": True})
    try:
        body = channel.recv() or {}
    except BaseException:
        shelf.abandon(slot)
        raise
    _receive(channel, shelf, slot, key, body, None)
    channel.send({"ok": True})


class Listener:
    """The store's TCP port for its peers: a thread per connection, each authenticated first."""

    def __init__(self, shelf: Shelf, key: PeerKey, host: str = "0.0.0.0", port: int = 0,
                 admits: Optional[Admits] = None) -> None:
        self._shelf, self._key, self._admits = shelf, key, admits
        self._sock = socket.create_server((host, port), backlog=16)
        self.port = self._sock.getsockname()[1]
        self._closed = threading.Event()
        self._conns: List[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="snapshot-peers", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(sock)
            threading.Thread(target=self._one, args=(sock,), name="snapshot-peer", daemon=True).start()

    def _one(self, sock: socket.socket) -> None:
        try:
            serve(accept(sock, self._key), self._shelf, self._admits)
        except (OSError, wire.WireError, PeerRefused):
            pass  # a stranger, a broken frame or a peer gone: dropped, nothing kept
        finally:
            wire.close_quietly(sock)
            with self._lock:
                if sock in self._conns:
                    self._conns.remove(sock)

    def close(self) -> None:
        self._closed.set()
        stop_listening(self._sock)
        with self._lock:
            for sock in self._conns:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def stop_listening(sock: socket.socket) -> None:
    """``shutdown`` wakes the thread blocked in ``accept`` (a bare ``close`` does not, on Linux)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    wire.close_quietly(sock)
