"""Every path ``@torchrun`` writes on a node, private to the user who runs it.

Layout, under the temporary directory (``$TMPDIR``, else ``/tmp``)::

    metaflow-torchrun-<uid>/            0700, owned by <uid>, never a symlink
        logs/<call id>/node-<N>/        per-rank copies of the output, kept within
            rank-<R>.stdout.log          a retention bound (the newest KEEP_LOGS
            rank-<R>.stderr.log          calls, at most MAX_LOG_MB in all)
        work/<pid>-<random>/            one call's work directory: failure records,
                                         rank status, pickles, the entry file and
                                         torchelastic's own directories; removed
                                         when the call ends

Every directory is checked with ``lstat`` (a directory, ours, closed to others,
not a symlink) before anything goes in it. Another user who made the base path
first does not get our files: this process uses a fresh ``mkdtemp`` directory
instead, with a warning; a symlink there is removed; a directory of ours with
loose permissions is tightened. Files are opened with ``O_NOFOLLOW`` and mode
0600 and checked to be regular files of ours.

A directory in use holds an exclusive ``flock`` on its ``.lock`` file (the
kernel drops it when the process dies, even by SIGKILL): the next call on the
host removes work directories nobody holds, so a killed task's leftovers go.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import tempfile
import time
from typing import List, Optional

# The one module above host/ that host/ reads (a leaf: it imports nothing; pyproject.toml).
from ..rank.names import KEEP_LOGS_ENV, MAX_LOG_MB_ENV
from .. import defaults as DEFAULTS
from .console import say

BASE_PREFIX = "metaflow-torchrun-"
LOGS = "logs"
WORK = "work"
LOCK_FILE = ".lock"

# Retention of the per-rank logs, per user and host: the logs of the newest
# KEEP_LOGS calls are kept, and older ones go while all logs take more than
# MAX_LOG_MB. The logs of a call whose task is still alive are never removed.
DEFAULT_KEEP_LOGS = DEFAULTS.KEEP_LOGS
DEFAULT_MAX_LOG_MB = DEFAULTS.MAX_LOG_MB
# A call directory this young is never pruned: another node of the same call
# (local runs put every node on one host) may be creating it right now.
YOUNG_SECONDS = 120.0

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_warned: set = set()


class UnsafePath(OSError):
    """A path that is not ours alone: a symlink, another user's, or not a
    regular file or directory."""


# -- directories -----------------------------------------------------------------


def _uid() -> int:
    return os.geteuid()


def check_private_dir(path: str) -> None:
    """``path`` is a real directory (not a symlink) owned by us and closed to
    others; a directory of ours with group or other bits set is tightened."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(errno.ELOOP, "is a symbolic link", path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(errno.ENOTDIR, "is not a directory", path)
    if st.st_uid != _uid():
        raise UnsafePath(errno.EPERM, "is owned by uid %d, not %d" % (st.st_uid, _uid()), path)
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)


def check_parent(path: str) -> None:
    """Refuse a parent that any user may write without the sticky bit: there
    another user can rename our directory away and put theirs in its place
    mid-call, with files we would read back (return values are pickles)."""
    st = os.stat(path)
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise UnsafePath(
            errno.EPERM,
            "is writable by every user and has no sticky bit, so another user could replace "
            "@torchrun's private directory in it; set TMPDIR to a directory of your own (or "
            "chmod +t it)",
            path,
        )


def private_dir(path: str) -> str:
    """Make ``path`` (its parent must be private already) a 0700 directory of
    ours, or check that it is one. Whatever else is there (a symlink, a file,
    another user's directory, left from before the parent was private) is
    moved aside and removed."""
    for attempt in range(2):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        try:
            check_private_dir(path)
            return path
        except UnsafePath:
            if attempt:
                raise
            _discard(path)
    return path


def _discard(path: str) -> None:
    aside = "%s.discarded-%s" % (path, os.urandom(6).hex())
    try:
        os.rename(path, aside)
    except OSError:
        return
    try:
        if stat.S_ISDIR(os.lstat(aside).st_mode):
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.unlink(aside)
    except OSError:
        pass


def _base_path(tmp: Optional[str] = None) -> str:
    return os.path.join(tmp or tempfile.gettempdir(), "%s%d" % (BASE_PREFIX, _uid()))


def base_dir(tmp: Optional[str] = None) -> str:
    """``$TMPDIR/metaflow-torchrun-<uid>``, private to this user.

    A symlink there is removed and the directory made; a directory another
    user made first is left alone and a fresh private one (``mkdtemp``) is used
    by this process instead, with a warning."""
    path = _base_path(tmp)
    check_parent(os.path.dirname(path))
    for _ in range(3):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        try:
            check_private_dir(path)
            return path
        except FileNotFoundError:
            continue  # removed under us: make it again
        except UnsafePath as e:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode):
                try:
                    os.unlink(path)
                    continue
                except OSError:
                    pass
            return _fallback_base(path, e, tmp)
    return _fallback_base(path, UnsafePath(errno.EAGAIN, "keeps changing", path), tmp)


_fallbacks: dict = {}


def _fallback_base(path: str, why: OSError, tmp: Optional[str]) -> str:
    key = (path, tmp)
    if key in _fallbacks and os.path.isdir(_fallbacks[key]):
        return _fallbacks[key]
    fresh = _reuse_fallback(tmp) or tempfile.mkdtemp(prefix=_fallback_prefix(), dir=tmp)
    _fallbacks[key] = fresh
    if path not in _warned:
        _warned.add(path)
        say("%s %s; not using it: this task keeps its files in %s instead." % (path, why.strerror or why, fresh))
    return fresh


def _fallback_prefix() -> str:
    return "%s%d-" % (BASE_PREFIX, _uid())


def _reuse_fallback(tmp: Optional[str]) -> Optional[str]:
    """While our base path is squatted, every task would make a fresh directory
    that no cleanup visits (8 after 4 runs of 2 nodes). Instead all tasks share
    the first fallback directory that is ours alone (by name, so every node picks
    the same), and the others go once nobody uses them: at most one stays."""
    parent = tmp or tempfile.gettempdir()
    try:
        names = sorted(n for n in os.listdir(parent) if n.startswith(_fallback_prefix()))
    except OSError:
        return None
    chosen = None
    for name in names:
        candidate = os.path.join(parent, name)
        try:
            check_private_dir(candidate)  # a symlink or a stranger's is never used
        except OSError:
            continue
        if chosen is None:
            chosen = candidate
        elif _removable_base(candidate):
            shutil.rmtree(candidate, ignore_errors=True)
    return chosen


def _removable_base(base: str) -> bool:
    """A whole fallback base: old enough, and no call's directory in it is held."""
    if not _removable(base, time.time()):
        return False
    for sub in (WORK, LOGS):
        root = os.path.join(base, sub)
        try:
            names = os.listdir(root)
        except OSError:
            continue
        if any(_in_use(os.path.join(root, name)) for name in names):
            return False
    return True


# -- files -----------------------------------------------------------------------


def _check_own_regular(fd: int, path: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(errno.EINVAL, "is not a regular file", path)
    if st.st_uid != _uid():
        raise UnsafePath(errno.EPERM, "is owned by uid %d, not %d" % (st.st_uid, _uid()), path)
    return st


def open_private(path: str, flags: int = os.O_WRONLY | os.O_CREAT | os.O_APPEND) -> int:
    """Open (creating it 0600) a regular file of ours; never through a symlink,
    never a FIFO or device; a file of ours open to others is tightened."""
    fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK, 0o600)
    try:
        st = _check_own_regular(fd, path)
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_tail(path: str, max_bytes: int) -> bytes:
    """The last ``max_bytes`` of a regular file of ours (not through a symlink)."""
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK)
    try:
        st = _check_own_regular(fd, path)
        os.lseek(fd, max(0, st.st_size - max_bytes), os.SEEK_SET)
        chunks = []
        left = max_bytes
        while left > 0:
            data = os.read(fd, min(left, 65536))
            if not data:
                break
            chunks.append(data)
            left -= len(data)
        return b"".join(chunks)
    finally:
        os.close(fd)


def tail_lines(path: str, count: int, max_bytes: int = 64 * 1024) -> List[str]:
    try:
        data = read_tail(path, max_bytes)
    except OSError:
        return []
    return data.decode(errors="replace").splitlines()[-count:]


# -- locks: "in use" -------------------------------------------------------------


def hold_lock(directory: str) -> int:
    """Mark ``directory`` in use for as long as this process holds the returned
    fd (an exclusive ``flock``, released by the kernel even after a SIGKILL,
    and seen across PID namespaces that share the file system)."""
    fd = open_private(os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT)
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


def _in_use(directory: str) -> bool:
    """Some live process holds the lock of ``directory`` (or of one of its
    ``node-N`` subdirectories, for a call's logs)."""
    candidates = [directory]
    try:
        candidates += [os.path.join(directory, n) for n in os.listdir(directory)]
    except OSError:
        return False
    for path in candidates:
        try:
            fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDONLY | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
    return False


def _removable(path: str, now: float) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    return now - st.st_mtime >= YOUNG_SECONDS and not _in_use(path)


# -- one call's files --------------------------------------------------------------


class CallFiles:
    """The work directory and the per-rank log directory of one call on this
    node, both held "in use" until ``close``, which removes the work directory
    (the logs stay, within the retention bound)."""

    def __init__(self, call_id: str, node_index: int, base: Optional[str] = None):
        self.base = base or base_dir()
        self.work_dir = ""
        self.log_dir: Optional[str] = None
        self._locks: List[int] = []
        try:
            self.work_dir = make_work_dir(self.base)
            self._locks.append(hold_lock(self.work_dir))
            self.log_dir = call_log_dir(call_id, node_index, self.base)
            if self.log_dir is not None:
                try:
                    self._locks.append(hold_lock(self.log_dir))
                except OSError:
                    pass
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        remove_work_dir(self.work_dir)
        for fd in self._locks:
            release_lock(fd)
        self._locks = []

    def __enter__(self) -> "CallFiles":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- work directories ----------------------------------------------------------------


def work_root(base: Optional[str] = None) -> str:
    return private_dir(os.path.join(base or base_dir(), WORK))


def make_work_dir(base: Optional[str] = None) -> str:
    """A fresh private work directory for one call; leftovers of tasks that
    are gone (a SIGKILL leaves its directory) are removed first."""
    root = work_root(base)
    prune_work_dirs(root)
    return tempfile.mkdtemp(prefix="%d-" % os.getpid(), dir=root)


def remove_work_dir(path: Optional[str]) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


def prune_work_dirs(root: str, now: Optional[float] = None) -> List[str]:
    """Remove the work directories no live process holds."""
    now = time.time() if now is None else now
    removed: List[str] = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        path = os.path.join(root, name)
        if _removable(path, now):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


# -- per-rank logs ---------------------------------------------------------------


def _env_number(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value >= 0 else default


def call_log_dir(call_id: str, node_index: int, base: Optional[str] = None) -> Optional[str]:
    """``logs/<call id>/node-<N>``, private; older calls' logs beyond the
    retention bound are removed first. None when no such directory can be made
    (the logs are a convenience, never a reason to fail the step)."""
    try:
        root = private_dir(os.path.join(base or base_dir(), LOGS))
        prune_logs(
            root,
            keep=int(_env_number(KEEP_LOGS_ENV, DEFAULT_KEEP_LOGS)),
            max_bytes=int(_env_number(MAX_LOG_MB_ENV, DEFAULT_MAX_LOG_MB) * 1024 * 1024),
            exclude=(call_id,),
        )
        call_dir = private_dir(os.path.join(root, call_id))
        return private_dir(os.path.join(call_dir, "node-%d" % node_index))
    except OSError:
        return None


def _size(path: str) -> int:
    total = 0
    for top, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                pass
    return total


def prune_logs(root: str, keep: int, max_bytes: int, exclude=(), now: Optional[float] = None) -> List[str]:
    """Remove the per-rank logs of old calls: every call beyond the newest
    ``keep``, then the oldest while all together take more than ``max_bytes``.
    A call whose task is alive, or whose directory is younger than
    ``YOUNG_SECONDS``, is kept."""
    now = time.time() if now is None else now
    entries = []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for name in names:
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue
        entries.append((st.st_mtime, name, path))
    entries.sort(reverse=True)  # newest first
    removed: List[str] = []

    def removable(mtime: float, name: str, path: str) -> bool:
        return name not in exclude and _removable(path, now)

    kept = []
    for i, (mtime, name, path) in enumerate(entries):
        if i >= keep and removable(mtime, name, path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        else:
            kept.append((mtime, name, path))
    sizes = [(_size(path), mtime, name, path) for mtime, name, path in kept]
    total = sum(s[0] for s in sizes)
    for size, mtime, name, path in sorted(sizes, key=lambda s: s[1]):  # oldest first
        if total <= max_bytes:
            break
        if removable(mtime, name, path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            total -= size
    return removed
