"""What a stand-in (``handoff.py``) and the zygote say over its Unix socket.

A request: one length-prefixed JSON object, the stand-in's stdio alongside
(``SCM_RIGHTS``). Replies, JSON lines: ``taken``, then ``pid`` or ``fresh``
(start fresh), then ``exit``. A request is read as hostile, field by field.
A stand-in imports this before it hands off: no ``typing`` or ``dataclasses``
at run time (a third of its CPU).
"""

from __future__ import annotations

import json
import socket
import struct
from collections import namedtuple

TYPE_CHECKING = False  # typing's own name, without importing typing (mypy reads it as true)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

MODULES = ("bootstrap", "agent", "zygote", "imports")  # "imports": a rank's offer (procs/warm_imports.py)
REPLIES = ("taken", "pid", "fresh", "exit")
MAX_REQUEST = 4 << 20  # an environment of a few MB is already absurd
MAX_REPLY = 4096
_LENGTH = struct.Struct("!I")


class WireError(ValueError):
    """A request or reply that does not hold to the format."""


# path: sys.path as the stand-in's interpreter computed it; stand_in: the pid torchrun (or the
# supervisor) knows; executable: the stand-in's interpreter (a zygote forks only for its own).
_REQUEST_FIELDS = namedtuple("_REQUEST_FIELDS", "module argv env cwd path umask stand_in executable",
                             defaults=(0o022, -1, ""))


class Request(_REQUEST_FIELDS):
    """What makes a fresh ``python -m <module> ARGV`` what it is, beyond what the zygote holds."""

    __slots__ = ()
    module: str
    argv: List[str]
    env: Dict[str, str]
    cwd: str
    path: List[str]
    umask: int
    stand_in: int
    executable: str

    def to_bytes(self) -> bytes:
        body = json.dumps(self._asdict()).encode()
        if len(body) > MAX_REQUEST:
            raise WireError("a request of %d bytes is over %d" % (len(body), MAX_REQUEST))
        return _LENGTH.pack(len(body)) + body

    @classmethod
    def from_json(cls, data: Any) -> "Request":
        if not isinstance(data, dict):
            raise WireError("not an object")
        module, argv, env = data.get("module"), data.get("argv"), data.get("env")
        if module not in MODULES:
            raise WireError("module %r is not one a zygote child runs" % (module,))
        if not (_strings(argv) and isinstance(env, dict) and _strings(list(env)) and _strings(list(env.values()))):
            raise WireError("argv and env must be strings")
        cwd, path, umask, stand_in = data.get("cwd"), data.get("path"), data.get("umask"), data.get("stand_in")
        if not isinstance(cwd, str) or not _strings(path):
            raise WireError("cwd and path must be strings")
        if not _small_int(umask, 0, 0o777) or not _small_int(stand_in, -1, 1 << 31):
            raise WireError("umask or stand_in out of range")
        executable = data.get("executable", "")
        if not isinstance(executable, str):
            raise WireError("executable must be a string")
        return cls(module=str(module), argv=list(argv or ()), env=dict(env), cwd=cwd, path=list(path or ()),
                   umask=int(umask or 0), stand_in=int(stand_in or 0), executable=executable)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and "\0" not in v for v in value)


def _small_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def send_request(sock: socket.socket, request: Request, fds: List[int]) -> None:
    data = request.to_bytes()
    if not fds:
        sock.sendall(data)
        return
    socket.send_fds(sock, [data[:65536]], fds)
    if len(data) > 65536:
        sock.sendall(data[65536:])


def recv_request(sock: socket.socket, max_fds: int = 3) -> Tuple[Request, List[int]]:
    """The caller owns the descriptors, also when this raises ``WireError``."""
    first, fds, _flags, _addr = socket.recv_fds(sock, 65536, max_fds)
    received = list(fds)
    try:
        if len(first) < _LENGTH.size:
            raise WireError("short request")
        (size,) = _LENGTH.unpack(first[:_LENGTH.size])
        if size > MAX_REQUEST:
            raise WireError("a request of %d bytes is over %d" % (size, MAX_REQUEST))
        body = bytearray(first[_LENGTH.size:])
        while len(body) < size:
            more = sock.recv(min(1 << 20, size - len(body)))
            if not more:
                raise WireError("the request ended early")
            body += more
        if len(body) != size:
            raise WireError("more than the request")
        try:
            data = json.loads(bytes(body))
        except ValueError as e:
            raise WireError("not JSON: %s" % e) from None
        return Request.from_json(data), received
    except WireError as e:
        e.fds = received  # type: ignore[attr-defined]
        raise


class ReplyReader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""

    def next(self) -> Optional[Dict[str, int]]:
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_REPLY:
                raise WireError("a reply line over %d bytes" % MAX_REPLY)
            chunk = self.sock.recv(MAX_REPLY)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            data = json.loads(line)
        except ValueError:
            raise WireError("a reply that is not JSON") from None
        if not isinstance(data, dict) or len(data) != 1:
            raise WireError("a reply that is not one field")
        (key, value), = data.items()
        if key not in REPLIES or not _small_int(value, -(1 << 31), 1 << 31):
            raise WireError("a reply of %r" % (key,))
        return {key: value}


def reply(key: str, value: int) -> bytes:
    return (json.dumps({key: int(value)}) + "\n").encode()
