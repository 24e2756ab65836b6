"""The gang's wire format: JSON objects, one per line, each line bounded.

Both ends read through ``LineReader``, which never holds more than one line's
worth of bytes beyond what it hands out, and never passes on anything but a
JSON object of bounded nesting: a peer cannot make a reader recurse, allocate
without bound or see a value of a type it did not expect.
"""

from __future__ import annotations

import json
import socket
from typing import Any, Dict, List, Optional

# No legitimate message comes near this (the largest is a node's report with
# the last lines of its ranks' output, or rank 0's return value).
MAX_LINE = 1 << 20
# Rank 0's pickled return value travels in one line, in base64: at most this
# many bytes (what is left over is room for the rest of the message).
RANK0_MAX = (MAX_LINE - 64 * 1024) * 3 // 4
# Before a peer has proved it holds the gang's secret, its lines are tiny (a
# hello): a stranger gets no room to make the service buffer or parse much.
PRE_AUTH_LINE = 4096
# JSON nested deeper than this is refused before it is parsed.
MAX_DEPTH = 32

Message = Dict[str, Any]


class ProtocolError(ValueError):
    """The peer does not speak our protocol: drop it."""


def encode(message: Message) -> bytes:
    data = (json.dumps(message, separators=(",", ":"), allow_nan=False) + "\n").encode()
    if len(data) > MAX_LINE:
        raise ValueError("gang message of %d bytes is over the %d byte limit" % (len(data), MAX_LINE))
    return data


def send(sock: socket.socket, message: Message) -> None:
    """Blocking: for a node's own connection, never for the service's loop."""
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
    """One line to a message, or None when it is not a JSON object."""
    if _too_deep(line):
        return None
    try:
        message = json.loads(line, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    return message if isinstance(message, dict) else None


def _no_constant(name: str) -> Any:
    raise ValueError("%s is not JSON" % name)


class LineReader:
    """Splits a byte stream into messages. A line over ``max_line`` raises
    ``ProtocolError``; so does a line that is not a JSON object when
    ``strict`` (the service drops such a peer), else it is skipped."""

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


def set_timeout(sock: Optional[socket.socket], seconds: float) -> bool:
    """Whether ``sock`` is open and now times out after ``seconds``: a reader
    thread may start after another thread closed its socket (EBADF)."""
    if sock is None:
        return False
    try:
        sock.settimeout(seconds)
    except OSError:
        return False
    return True
