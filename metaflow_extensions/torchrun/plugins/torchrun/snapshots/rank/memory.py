"""The memory a snapshot is written in: a sealed memfd the node's store makes and a rank maps.

The store creates each slot (``create``): an anonymous file of a fixed size, sealed against
shrinking and growing before any rank sees it, so no rank can truncate it under the store's
mapping (a read past a file's end is a SIGBUS that would end the task). Its fd goes to the
rank over the Unix socket (``send_fd``/``recv_fd``); both map it shared, so what the rank copies
in is the store's with no copy between them. Nothing of it is on a disk or a mounted tmpfs.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import socket
from typing import Optional

PAGE = mmap.PAGESIZE
SEALS = getattr(fcntl, "F_SEAL_SHRINK", 2) | getattr(fcntl, "F_SEAL_GROW", 4) | getattr(fcntl, "F_SEAL_SEAL", 1)
_MARK = b"F"


class SlotError(OSError):
    """A slot's fd that is not the size it was said to be, or that did not arrive."""


def unavailable() -> Optional[str]:
    """None where sealed memfds exist (Linux 3.17+, Python 3.8+); else why snapshots are off."""
    if not hasattr(os, "memfd_create") or not hasattr(fcntl, "F_ADD_SEALS"):
        return "this platform has no sealed memfd (os.memfd_create, Linux only): snapshots are off"
    if not hasattr(socket, "send_fds"):
        return "this Python cannot pass an fd over a Unix socket (3.9+): snapshots are off"
    return None


def room(size: int) -> int:
    """A slot's capacity for a snapshot of ``size``: whole pages and 1/64 more, so a step's few more
    bytes (a longer step number, an optimizer's state appearing) reuse the same slot."""
    want = size + size // 64 + PAGE
    return (want + PAGE - 1) // PAGE * PAGE


def create(size: int, name: str) -> int:
    """A new memfd of ``size`` bytes, sealed: nobody can change its size from here on."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def is_sealed(fd: int) -> bool:
    return fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS == SEALS


def map_shared(fd: int, size: int, populate: bool = False) -> mmap.mmap:
    """A shared, writable mapping of the slot; ``SlotError`` unless the file is exactly ``size``
    and sealed (a mapping past the end would fault). ``populate``: its pages made at once, so a
    rank's first copy into it takes no page faults."""
    if os.fstat(fd).st_size != size or not is_sealed(fd):
        raise SlotError("a snapshot slot of %d bytes that is not sealed at that size" % size)
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    return mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def read_only(fd: int) -> int:
    """Another fd of the same slot that can only be read (what a load is handed)."""
    return os.open("/proc/self/fd/%d" % fd, os.O_RDONLY | os.O_CLOEXEC)


def copy_out(fd: int, size: int) -> bytearray:
    """The slot's first ``size`` bytes in this process's own memory: one copy, by the kernel."""
    if os.fstat(fd).st_size < size:
        raise SlotError("a snapshot slot of %d bytes holding %d" % (os.fstat(fd).st_size, size))
    out = bytearray(size)
    view = memoryview(out)
    got = 0
    while got < size:
        n = os.preadv(fd, [view[got:]], got)
        if n <= 0:
            raise SlotError("a snapshot slot ended after %d of %d bytes" % (got, size))
        got += n
    return out


def send_fd(sock: socket.socket, fd: int) -> None:
    """One marker byte carrying ``fd``: sent after the header that announces it."""
    socket.send_fds(sock, [_MARK], [fd])


def recv_fd(sock: socket.socket) -> int:
    data, fds, _flags, _addr = socket.recv_fds(sock, 1, 1)
    if data != _MARK or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise SlotError("the store announced a slot's fd and sent none")
    return fds[0]


def close_quietly(fd: Optional[int]) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
