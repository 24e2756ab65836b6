"""The stand-in: a process torchrun (or the node's supervisor) started, which
has the node's zygote (``zygote.py``) fork the real one and stands in its place.

torchrun knows its workers by pid: it signals their process groups and reaps
their exits. The stand-in keeps that true. It passes its stdin, stdout and
stderr to the zygote with what makes it the process it is (argv, environment,
working directory, ``sys.path``, umask), forwards every signal a launcher sends
to the forked child, and exits as the child did: the same code, or killed by
the same signal. If the stand-in is killed, the zygote kills the child; if the
zygote dies, its children die with it (their parent-death signal) and the
stand-in exits as killed.

Where no zygote answers (none started, or it went away before forking), the
module runs here, as it always did: a warm start is a speed-up, never a
condition. Runs before anything else in the rank or agent: no Metaflow, no torch.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import sys
import time
from typing import Dict, Mapping, NoReturn, Optional, Sequence, Tuple

from .names import ZYGOTE_ENV
from .zygote_wire import ReplyReader, Request, WireError, send_request

# True in a process the zygote forked: it runs its module itself.
FORKED = False
# What a launcher sends a worker: passed on to the real one.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def hand_off(module: str, argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> None:
    """Have the zygote run ``module`` with ``argv`` in this process's place,
    and exit as it exits. Returns only where no zygote took it."""
    if FORKED:
        return
    path = environ.get(ZYGOTE_ENV)
    if not path:
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        if peer_uid(sock) != os.getuid():
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
    _forward_signals(child)
    _exit_as(_wait_exit(reader))


def _forked(reader: ReplyReader) -> Tuple[bool, Optional[Dict[str, int]]]:
    """Whether the zygote took the start ("taken"), and its next answer: the
    child's pid, "fresh", or None (gone, or an answer that is not one)."""
    first = reader.next()
    if first is None or "taken" not in first:
        return False, first
    try:
        return True, reader.next()
    except (OSError, WireError):
        return True, None


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _forward_signals(child: int) -> None:
    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(child, signum)
        except OSError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)


def _wait_exit(reader: ReplyReader) -> int:
    """The child's exit as the zygote reaped it; the zygote gone first means
    the child was killed with it."""
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
    """Exit as the child did, so torchrun (or the supervisor) reads the same status."""
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

