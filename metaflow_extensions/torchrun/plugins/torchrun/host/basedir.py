"""Where a node's files live: the base directory of this user on this host,
and the fallback when another user squats its path.

Layout, under the temporary directory (``$TMPDIR``, else ``/tmp``)::

    metaflow-torchrun-<uid>/            0700, owned by <uid>, never a symlink
        logs/<flow>-<run id>/           one run's per-rank logs (logs.py)
        work/<pid>-<random>/            one call's work directory (workdirs.py)
    metaflow-torchrun-<uid>-<random>/   a fallback base, only while the path
                                         above is another user's

Another user who made the base path first does not get our files: the task
uses a fallback base (``mkdtemp``) instead, with a warning, shared by every
task of the user while the squat lasts (the first one that is ours alone, by
name). Each task holds a shared lock on the fallback's ``.in-use`` for its
life. Once the usual base is ours again, the next call there claims every
fallback base nobody holds (an exclusive lock on ``.in-use``, and no call's
directory held in it), moves its runs' logs under the usual base's ``logs/``,
where retention applies, and removes it (``logs.adopt_fallbacks``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import tempfile
import time
from typing import Dict, List, Optional, Tuple

from .console import say
from .private import (
    UnsafePath,
    check_parent,
    check_private_dir,
    in_use,
    open_private,
    release_lock,
    removable,
    uid,
)

BASE_PREFIX = "metaflow-torchrun-"
LOGS = "logs"
WORK = "work"
# In a fallback base: every task using it holds a shared lock on it.
IN_USE_FILE = ".in-use"
# How deep the lock of a call's logs lies below a run's directory
# (<step>/c<call>/node-<N>/.lock).
RUN_LOCK_DEPTH = 3

_warned: set = set()


def _base_path(tmp: Optional[str] = None) -> str:
    return os.path.join(tmp or tempfile.gettempdir(), "%s%d" % (BASE_PREFIX, uid()))


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


_fallbacks: Dict[Tuple[str, Optional[str]], str] = {}
# Fallback base -> this process's shared hold on its IN_USE_FILE (kept while it lives).
_shares: Dict[str, int] = {}


def _fallback_base(path: str, why: OSError, tmp: Optional[str]) -> str:
    key = (path, tmp)
    if key in _fallbacks and os.path.isdir(_fallbacks[key]):
        return _fallbacks[key]
    fresh = _reuse_fallback(tmp)
    for _ in range(3):
        if fresh is not None and _share(fresh):
            break
        fresh = tempfile.mkdtemp(prefix=_fallback_prefix(), dir=tmp)
    assert fresh is not None
    _fallbacks[key] = fresh
    if path not in _warned:
        _warned.add(path)
        say("%s %s; not using it: this task keeps its files in %s instead." % (path, why.strerror or why, fresh))
    return fresh


def _fallback_prefix() -> str:
    return "%s%d-" % (BASE_PREFIX, uid())


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
        elif removable(candidate, time.time(), depth=0):  # its calls' locks: _claim
            hold = _claim(candidate)
            if hold is not None:
                _remove(candidate, hold)
    return chosen


def _share(base: str) -> bool:
    """Hold a shared lock on ``base``'s ``IN_USE_FILE`` for the rest of this
    process: whoever would empty a fallback base takes an exclusive one first
    (``_claim``), so no base a live task uses is emptied. False when it cannot
    be had (the base is being emptied, or is gone)."""
    if base in _shares:
        return True
    lock_path = os.path.join(base, IN_USE_FILE)
    try:
        fd = open_private(lock_path, os.O_RDWR | os.O_CREAT)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        check_private_dir(base)
        if os.lstat(lock_path).st_ino != os.fstat(fd).st_ino:
            raise OSError(errno.ESTALE, "replaced", lock_path)
    except OSError:
        os.close(fd)
        return False
    _shares[base] = fd
    return True


def _claim(base: str) -> Optional[int]:
    """An exclusive hold on a fallback base no live task uses (none holds its
    ``IN_USE_FILE`` shared, none holds a call's directory in it), or None. A
    base without the file yet is claimed only once it is ``YOUNG_SECONDS``
    old: its maker may be about to take its share."""
    lock_path = os.path.join(base, IN_USE_FILE)
    if not os.path.lexists(lock_path) and not removable(base, time.time(), depth=0):
        return None
    try:
        fd = open_private(lock_path, os.O_RDWR | os.O_CREAT)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    if _calls_in_it(base):
        os.close(fd)
        return None
    return fd


def _remove(base: str, hold: int) -> None:
    shutil.rmtree(base, ignore_errors=True)
    release_lock(hold)


def left_fallbacks(base: str) -> List[Tuple[str, int]]:
    """The fallback bases this user left beside ``base`` when ``base`` is the
    usual one (a squat there has ended), each claimed (``_claim``): the
    caller moves what it keeps out of each, then ``remove_fallback``. Never a
    symlink, another user's directory, or a base a live task uses."""
    parent, name = os.path.split(base)
    if name != "%s%d" % (BASE_PREFIX, uid()):
        return []
    try:
        names = sorted(n for n in os.listdir(parent) if n.startswith(_fallback_prefix()))
    except OSError:
        return []
    claimed = []
    for name in names:
        candidate = os.path.join(parent, name)
        try:
            check_private_dir(candidate)
        except OSError:
            continue
        hold = _claim(candidate)
        if hold is not None:
            claimed.append((candidate, hold))
    return claimed


def remove_fallback(base: str, hold: int, keep: bool = False) -> None:
    """Remove a claimed fallback base (``keep``: only let go of it)."""
    if keep:
        release_lock(hold)
    else:
        _remove(base, hold)


def _calls_in_it(base: str) -> bool:
    """Some live process holds a call's directory in ``base``: a work
    directory, or a run's logs (down to ``<step>/c<call>/node-<N>``)."""
    for sub in (WORK, LOGS):
        root = os.path.join(base, sub)
        try:
            names = os.listdir(root)
        except OSError:
            continue
        if any(in_use(os.path.join(root, name), RUN_LOCK_DEPTH) for name in names):
            return True
    return False


