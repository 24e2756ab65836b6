"""The stand-in: the process torchrun started, which has the node's zygote fork
the real one, forwards it every signal and exits as it did, so torchrun's pids
stay true. Where no zygote answers, the module runs here: a warm start is a
speed-up, never a condition.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import sys
import time

from ..base.timeouts import WARM_SOCKET_WAIT
from ..host.unix_socket import connect_unix
from .names import ZYGOTE_ENV
from .zygote_wire import ReplyReader, Request, WireError, send_request

TYPE_CHECKING = False  # typing unimported (zygote_wire.py)
if TYPE_CHECKING:
    from typing import Dict, Mapping, NoReturn, Optional, Sequence, Tuple

FORKED = False  # in a process the zygote forked: it runs its module itself
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def stand_in(module: str, tie: bool = False) -> None:
    """What ``python -m <module>`` does first, at the top of the module, before
    the imports only a run here needs: the warm process runs it, and this
    process relays. ``tie``: die with the parent (a rank with torchrun's agent)."""
    if tie:
        from ..host.proctree import die_with_parent  # the rank-start boundary: a rank's stand-in only

        parent = os.getppid()
        die_with_parent()
        if os.getppid() != parent:  # the parent died before we asked to die with it
            os._exit(1)
    hand_off(module, sys.argv[1:])


def hand_off(module: str, argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> None:
    """Returns only where no zygote took it."""
    if FORKED:
        return
    path = environ.get(ZYGOTE_ENV)
    if not path:
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _connect(sock, path)
        if peer_credentials(sock)[1] != os.getuid():
            raise OSError("the zygote at %s is another user's" % path)  # never hand it our environment
        umask = os.umask(0o022)
        os.umask(umask)
        request = Request(module=module, argv=list(argv), env=dict(environ), cwd=os.getcwd(),
                          path=list(sys.path), umask=umask, stand_in=os.getpid(), executable=sys.executable)
        send_request(sock, request, [0, 1, 2])
        reader = ReplyReader(sock)
        taken, first = _forked(reader)
    except (OSError, WireError):
        taken, first = False, None
    if first is None or "pid" not in first:
        sock.close()
        if taken and (first is None or "fresh" not in first):
            _exit_as(-signal.SIGKILL)  # the zygote died as it forked: its child (if any) with it
        return
    child = first["pid"]

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(child, signum)
        except OSError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    _exit_as(_wait_exit(reader))


def _connect(sock: socket.socket, path: str) -> None:
    """A warm process named is one started: its socket not there yet, it is still loading
    (only a socket with no one listening means it is gone)."""
    deadline = time.monotonic() + WARM_SOCKET_WAIT
    while True:
        try:
            connect_unix(sock, path)
            return
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _forked(reader: ReplyReader) -> Tuple[bool, Optional[Dict[str, int]]]:
    """Whether the zygote said "taken", and its next answer (None: gone)."""
    first = reader.next()
    if first is None or "taken" not in first:
        return False, first
    try:
        return True, reader.next()
    except (OSError, WireError):
        return True, None


def peer_credentials(sock: socket.socket) -> Tuple[int, int]:
    """The peer's pid (0 where it lives in a pid namespace this one cannot see) and uid, as the kernel says."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def _wait_exit(reader: ReplyReader) -> int:
    """The zygote gone first means the child was killed with it."""
    while True:
        try:
            message = reader.next()
        except (OSError, WireError):
            message = None
        if message is None:
            return -signal.SIGKILL
        if "exit" in message:
            return message["exit"]


def _exit_as(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code >= 0:
        os._exit(code & 0xFF)
    sig = -code
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        try:
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        except (OSError, ValueError):
            pass
    try:
        os.kill(os.getpid(), sig)
        time.sleep(1.0)
    except (OSError, ValueError):
        pass
    os._exit(128 + sig)

