"""The frames a rank and its node's snapshot store (and two stores) exchange.

A frame: a u32 length, a JSON object of at most ``MAX_HEADER`` bytes, then, when the header
says so, ``size`` raw bytes (a snapshot, between two stores) or one byte carrying an fd (a slot,
from a store to its rank: ``memory.send_fd``). Each side reads the other as hostile: a header is
bounded before it is read, its fields checked by type and range, a body's size checked by the
receiver against its own limit before anything is allocated.
"""

from __future__ import annotations

import json
import re
import socket
import struct
from typing import Any, Dict, Optional

MAX_HEADER = 64 * 1024
_LENGTH = struct.Struct("!I")
_CHUNK = 8 << 20
MAX_INDEX = 1 << 20  # a rank or local rank
_KEY = re.compile(r"\A(rank|local)-(0|[1-9][0-9]{0,6})(?:-of-([1-9][0-9]{0,6}))?\Z")


class WireError(ValueError):
    """The other side broke the format: drop the connection."""


def key_for(replicated: bool, rank: int, local_rank: int, world: int) -> str:
    """Sharded state is kept per rank of a world size (a shard of 6 ranks' state is no shard of 4's: after a
    node is lost and the gang trains on smaller, none is found and the ranks resume from their checkpoint);
    replicated state once per local rank, whatever the world size (every node holds a copy)."""
    return "local-%d" % local_rank if replicated else "rank-%d-of-%d" % (rank, world)


def world_of(key: str) -> Optional[int]:
    """The world size a sharded key names (``rank-R-of-W``); None for replicated state, of any world."""
    match = _KEY.match(key)
    return int(match.group(3)) if match is not None and match.group(3) else None


def is_key(value: Any) -> bool:
    match = _KEY.match(value) if isinstance(value, str) else None
    return match is not None and int(match.group(2)) < MAX_INDEX and int(match.group(3) or 1) <= MAX_INDEX


def send_frame(sock: socket.socket, header: Dict[str, Any], body: Optional[Any] = None) -> None:
    data = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_HEADER:
        raise WireError("a frame header of %d bytes, over %d" % (len(data), MAX_HEADER))
    sock.sendall(_LENGTH.pack(len(data)) + data)
    if body is not None:
        sock.sendall(body)


def header_bytes(header: Dict[str, Any]) -> bytes:
    """The header as sent: what a MAC covers."""
    return json.dumps(header, separators=(",", ":"), allow_nan=False, sort_keys=True).encode()


def recv_header(sock: socket.socket) -> Optional[Dict[str, Any]]:
    """None when the other side closed between frames; ``WireError`` for anything malformed."""
    first = _recv_exact(sock, _LENGTH.size, eof_ok=True)
    if first is None:
        return None
    (length,) = _LENGTH.unpack(first)
    if length > MAX_HEADER:
        raise WireError("a frame header of %d bytes, over %d" % (length, MAX_HEADER))
    raw = _recv_exact(sock, length)
    try:
        header = json.loads(bytes(raw or b""), parse_constant=_refuse)
    except (ValueError, RecursionError):
        raise WireError("a frame header that is not JSON") from None
    if not isinstance(header, dict):
        raise WireError("a frame header that is not a JSON object")
    return header


def recv_body(sock: socket.socket, size: int) -> bytearray:
    """Exactly ``size`` bytes; ``WireError`` if the sender stops short (killed mid-send)."""
    body = _recv_exact(sock, size)
    assert body is not None
    return body


def recv_into(sock: socket.socket, view: memoryview) -> None:
    """Exactly ``len(view)`` bytes into ``view`` (a slot's mapping); ``WireError`` if the sender stops short."""
    if not _fill(sock, view, eof_ok=False):
        raise WireError("the other side closed")


def _recv_exact(sock: socket.socket, size: int, eof_ok: bool = False) -> Optional[bytearray]:
    out = bytearray(size)
    return out if _fill(sock, memoryview(out), eof_ok) else None


def _fill(sock: socket.socket, view: memoryview, eof_ok: bool) -> bool:
    size, got = len(view), 0
    while got < size:
        n = sock.recv_into(view[got:], min(_CHUNK, size - got))
        if n == 0:
            if eof_ok and got == 0:
                return False
            raise WireError("the other side stopped after %d of %d bytes" % (got, size))
        got += n
    return True


def _refuse(name: str) -> Any:
    raise ValueError("%s is not JSON" % name)


def int_field(header: Dict[str, Any], name: str, low: int, high: int) -> int:
    value = header.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise WireError("field %r is not an int from %d to %d" % (name, low, high))
    return value


def key_field(header: Dict[str, Any]) -> str:
    key = header.get("key")
    if not is_key(key):
        raise WireError("field 'key' is not rank-N-of-W or local-N")
    return str(key)


def close_quietly(sock: Optional[socket.socket]) -> None:
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass
