"""The gang's wire format: JSON objects, one per line, each line bounded.

``LineReader`` never holds more than a line and passes on only JSON objects of
bounded nesting: a peer cannot make a reader recurse or allocate without bound.
"""

from __future__ import annotations

import json
import socket
from typing import Any, Dict, List, Optional

MAX_LINE = 1 << 20
# Rank 0's pickled return value, in base64 in one line, with room for the rest of the message.
RANK0_MAX = (MAX_LINE - 64 * 1024) * 3 // 4
PRE_AUTH_LINE = 4096  # a stranger's lines (a hello) are tiny
MAX_DEPTH = 32  # JSON nested deeper is refused before it is parsed

Message = Dict[str, Any]


class ProtocolError(ValueError):
    """The peer does not speak our protocol: drop it."""


def encode(message: Message) -> bytes:
    data = (_ENCODER.encode(message) + "\n").encode()
    if len(data) > MAX_LINE:
        raise ValueError("gang message of %d bytes is over the %d byte limit" % (len(data), MAX_LINE))
    return data


def send(sock: socket.socket, message: Message) -> None:
    sock.sendall(encode(message))


def _too_deep(line: bytes) -> bool:
    if line.count(b"[") + line.count(b"{") <= MAX_DEPTH:
        return False  # cannot be deeper: skip the byte-by-byte scan (C speed)
    depth = 0
    in_string = escaped = False
    for byte in line:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


def decode(line: bytes) -> Optional[Message]:
    """UTF-8 only (what ``encode`` writes); NaN and Infinity are not JSON."""
    if _too_deep(line):
        return None
    try:
        message = _DECODER.decode(line.decode())
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return message if isinstance(message, dict) else None


def _no_constant(name: str) -> Any:
    raise ValueError("%s is not JSON" % name)


# Made once, as json.dumps and json.loads make theirs for their defaults: with options of their
# own they would build one per message (a heartbeat a second from every node).
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_DECODER = json.JSONDecoder(parse_constant=_no_constant)


class LineReader:
    """``ProtocolError`` for a line over ``max_line``, or not a JSON object when ``strict`` (else skipped)."""

    def __init__(self, max_line: int = MAX_LINE, strict: bool = False) -> None:
        self._parts: List[bytes] = []
        self._size = 0
        self.max_line = max_line
        self.strict = strict

    def feed(self, data: bytes) -> List[Message]:
        out: List[Message] = []
        while data:
            cut = data.find(b"\n")
            if cut < 0:
                self._hold(data)
                break
            self._hold(data[:cut])
            line = b"".join(self._parts)
            self._parts, self._size = [], 0
            data = data[cut + 1 :]
            message = decode(line)
            if message is not None:
                out.append(message)
            elif self.strict:
                raise ProtocolError("a line that is not a JSON object")
        return out

    def _hold(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > self.max_line:
            raise ProtocolError("a line of over %d bytes" % self.max_line)
        if chunk:
            self._parts.append(chunk)


def close_quietly(sock: Optional[socket.socket]) -> None:
    if sock is None:
        return
    try:
        sock.close()
    except OSError:
        pass
