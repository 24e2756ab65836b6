"""A Unix socket at a path of any length.

An AF_UNIX address holds at most 107 bytes of path (Linux's ``sun_path``, less its
NUL). The warm process's socket lives in the step's work directory under TMPDIR,
and under a deep TMPDIR (a CI runner's, a test's own: 128 bytes) its bind failed,
so every agent and rank imported torch itself, saying nothing. A longer path is
reached through the directory's descriptor instead, ``/proc/self/fd/N/<name>``,
which the kernel resolves as it resolves the path itself: the socket is created,
and found, in the same directory with the same permissions.
"""

from __future__ import annotations

import os
import socket

MAX_PATH = 107  # bytes of sun_path, less its NUL


def bind_unix(sock: socket.socket, path: str) -> None:
    _at(sock.bind, path)


def connect_unix(sock: socket.socket, path: str) -> None:
    """Raises FileNotFoundError where nothing is there yet, as ``connect(path)`` does."""
    _at(sock.connect, path)


def _at(call, path: str) -> None:
    if len(os.fsencode(path)) <= MAX_PATH:
        call(path)
        return
    directory, name = os.path.split(path)
    fd = os.open(directory or ".", os.O_PATH | os.O_DIRECTORY)
    try:
        call("/proc/self/fd/%d/%s" % (fd, name))
    finally:
        os.close(fd)
