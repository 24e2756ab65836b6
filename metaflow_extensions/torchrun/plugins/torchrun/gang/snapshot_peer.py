"""Snapshots between two nodes' stores over TCP: a push to the buddy node, a fetch by a spare.

Both sides prove they hold the gang's secret before anything else (``gang/auth.py``'s proof,
with sides of their own, so a proof on the gang's port never passes here, nor the other way);
every frame after carries an HMAC under a key of this connection (both nonces), over its
sequence number and header. A snapshot's header names its SHA-256, so the bytes that follow
are checked against an authenticated digest: a push that fails any check is dropped, its body
never decoded. Nothing is unpickled; the snapshot is the codec's bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..procs import snapshot_wire as wire
from . import auth
from .snapshot_shelf import Held, Shelf

PROTOCOL = 1
HANDSHAKE_TIMEOUT = 5.0
IO_TIMEOUT = 60.0  # a snapshot of GBs on a slow link
Address = Tuple[str, int]


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

    def recv_snapshot(self, header: Dict[str, Any], max_size: int) -> bytearray:
        """The body an authenticated header announced, kept only if its digest is the header's."""
        size = wire.int_field(header, "size", 64, max_size)
        digest = header.get("sha256")
        if not isinstance(digest, str) or len(digest) != 64:
            raise PeerRefused("a snapshot header with no digest")
        blob = wire.recv_body(self.sock, size)
        actual = hashlib.sha256(memoryview(blob)[:size - 32]).hexdigest()
        if not (hmac.compare_digest(actual, digest) and hmac.compare_digest(bytes.fromhex(digest), blob[-32:])):
            raise PeerRefused("a snapshot whose bytes do not match its authenticated digest: dropped")
        return blob

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


def announce(held: Held) -> Dict[str, Any]:
    return {"key": held.key, "step": held.step, "size": held.size, "sha256": held.digest.hex()}


# -- the client's requests ------------------------------------------------------------


def push(channel: Channel, held: Held) -> Optional[str]:
    """None once the peer holds it; else the peer's reason (its budget)."""
    channel.send(dict(announce(held), op="push"))
    answer = channel.recv() or {}
    if not answer.get("go"):
        return str(answer.get("why", "refused"))[:500]
    channel.sock.sendall(held.blob)
    done = channel.recv() or {}
    return None if done.get("ok") else str(done.get("why", "not kept"))[:500]


def fetch(channel: Channel, key: str, max_size: int) -> List[Tuple[int, bytearray]]:
    """Every snapshot the peer holds for ``key``, oldest first, each checked against its digest."""
    channel.send({"op": "steps", "key": key})
    answer = channel.recv() or {}
    steps = answer.get("steps")
    if not isinstance(steps, list) or len(steps) > 8:
        raise PeerRefused("a steps answer that is not a short list")
    out = []
    for step in steps:
        channel.send({"op": "fetch", "key": key, "step": step})
        header = channel.recv() or {}
        if header.get("size") is None:
            continue  # dropped since it answered
        blob = channel.recv_snapshot(header, max_size)
        out.append((wire.int_field(header, "step", 0, 1 << 53), blob))
    return out


# -- the server's side ----------------------------------------------------------------


def serve(channel: Channel, shelf: Shelf) -> None:
    """Answer one authenticated peer until it closes; any broken frame ends the connection."""
    while True:
        header = channel.recv()
        if header is None:
            return
        op, key = header.get("op"), wire.key_field(header)
        if op == "push":
            _take_push(channel, shelf, key, header)
        elif op == "steps":
            channel.send({"steps": shelf.steps(key)})
        elif op == "fetch":
            held = shelf.get(key, wire.int_field(header, "step", 0, 1 << 53))
            channel.send(announce(held) if held else {"size": None}, held.blob if held else None)
        else:
            raise PeerRefused("an unknown request")


def _take_push(channel: Channel, shelf: Shelf, key: str, header: Dict[str, Any]) -> None:
    step = wire.int_field(header, "step", 0, 1 << 53)
    size = wire.int_field(header, "size", 64, 1 << 48)
    ticket = shelf.begin(key, size)
    if ticket is None:
        channel.send({"go": False, "why": "over this node's snapshot budget (%d of %d bytes in use, %d asked)"
                      % (shelf.used(), shelf.budget, size)})
        return
    channel.send({"go": True})
    try:
        blob = channel.recv_snapshot(header, size)
    except BaseException:
        shelf.abandon(ticket)
        raise
    shelf.finish(ticket, step, blob)
    channel.send({"ok": True})


class Listener:
    """The store's TCP port for its peers: a thread per connection, each authenticated first."""

    def __init__(self, shelf: Shelf, key: PeerKey, host: str = "0.0.0.0", port: int = 0) -> None:
        self._shelf, self._key = shelf, key
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
            serve(accept(sock, self._key), self._shelf)
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
