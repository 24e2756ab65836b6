"""Files and directories private to the user who runs the task: every path
``@torchrun`` writes goes through here. A directory is checked with ``lstat``
(ours, closed to others, not a symlink); a file is opened with ``O_NOFOLLOW``,
0600, and checked to be a regular file of ours: a planted FIFO or link is never used.

A directory in use holds an exclusive ``flock`` on its ``.lock`` (dropped by the
kernel even on SIGKILL): every clean-up asks ``in_use`` first.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import time
from typing import List, Optional

LOCK_FILE = ".lock"
# A directory this young is never removed: another node of a local run may be creating it now.
YOUNG_SECONDS = 120.0

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class UnsafePath(OSError):
    """A path that is not ours alone: a symlink, another user's, or not a regular file or directory."""


def uid() -> int:
    return os.geteuid()


def _check_owner(st: os.stat_result, path: str) -> None:
    if st.st_uid != uid():
        raise UnsafePath(errno.EPERM, "is owned by uid %d, not %d" % (st.st_uid, uid()), path)


def check_private_dir(path: str) -> None:
    """``path`` is a real directory of ours, closed to others (tightened if it was open)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(errno.ELOOP, "is a symbolic link", path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(errno.ENOTDIR, "is not a directory", path)
    _check_owner(st, path)
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)


def check_parent(path: str) -> None:
    """Refuse a parent any user may write without the sticky bit: another user could swap
    our directory for theirs mid-call, with files we would read back (pickles)."""
    st = os.stat(path)
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise UnsafePath(errno.EPERM, "is writable by every user and has no sticky bit, so another user could "
                         "replace @torchrun's private directory in it; set TMPDIR to a directory of your own "
                         "(or chmod +t it)", path)


def make_private(path: str) -> str:
    """Make ``path`` a 0700 directory unless it exists, and check that it is a private one of ours."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_private_dir(path)
    return path


def private_dir(path: str) -> str:
    """``make_private`` in a private parent: whatever else is there is moved aside and removed."""
    try:
        return make_private(path)
    except UnsafePath:
        discard(path)
    return make_private(path)


def discard(path: str) -> None:
    aside = "%s.discarded-%s" % (path, os.urandom(6).hex())
    try:
        os.rename(path, aside)
        if stat.S_ISDIR(os.lstat(aside).st_mode):
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.unlink(aside)
    except OSError:
        pass


def open_private(path: str, flags: int = os.O_WRONLY | os.O_CREAT | os.O_APPEND) -> int:
    """A regular file of ours opened (created 0600), never through a symlink and
    never blocking on a FIFO; a file of ours open to others is tightened."""
    fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(errno.EINVAL, "is not a regular file", path)
        _check_owner(st, path)
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_tail(path: str, max_bytes: int) -> bytes:
    """The last ``max_bytes`` of a regular file of ours."""
    fd = open_private(path, os.O_RDONLY)
    with open(fd, "rb") as f:
        f.seek(max(0, os.fstat(fd).st_size - max_bytes))
        return f.read(max_bytes)


def tail_lines(path: str, count: int, max_bytes: int = 64 * 1024) -> List[str]:
    try:
        data = read_tail(path, max_bytes)
    except OSError:
        return []
    return data.decode(errors="replace").splitlines()[-count:]


def hold_lock(directory: str, name: str = LOCK_FILE) -> int:
    """Mark ``directory`` in use while this process holds the returned fd (an exclusive
    ``flock``, seen across PID namespaces); ``OSError`` when another process holds it."""
    fd = open_private(os.path.join(directory, name), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def release_lock(fd: Optional[int]) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def _lock_held(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def in_use(directory: str, depth: int) -> bool:
    """Some live process holds the lock of ``directory`` or of one up to ``depth`` levels below (no symlinks)."""
    if _lock_held(os.path.join(directory, LOCK_FILE)):
        return True
    if depth <= 0:
        return False
    try:
        with os.scandir(directory) as entries:
            below = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return False
    return any(in_use(path, depth - 1) for path in below)


def removable(path: str) -> bool:
    """A directory (not a link) older than ``YOUNG_SECONDS`` whose lock no live process holds."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and time.time() - st.st_mtime >= YOUNG_SECONDS and not in_use(path, 0)
