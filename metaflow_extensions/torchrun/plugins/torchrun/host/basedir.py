"""Where a node's files live: this user's base directory under ``$TMPDIR`` (else
``/tmp``), and the fallback when another user squats its path::

    metaflow-torchrun-<uid>/            0700, owned by <uid>, never a symlink
        logs/<flow>-<run id>/           one run's per-rank logs (logs.py)
        work/<pid>-<random>/            one call's work directory (workdirs.py)
    metaflow-torchrun-<uid>-<random>/   a fallback base, only while the path
                                         above is another user's

The fallback's life, shared while the squat lasts and emptied once it ends:
docs/design.md ("Per-rank logs on a host").
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import tempfile
from typing import Dict, List, Optional, Tuple

from .console import say
from .private import UnsafePath, check_parent, check_private_dir, in_use, make_private, open_private, release_lock
from .private import removable, uid

BASE_PREFIX = "metaflow-torchrun-"
LOGS = "logs"
WORK = "work"
IN_USE_FILE = ".in-use"  # in a fallback base: every task using it holds a shared lock on it
# How deep the lock of a call's logs lies below a run's directory (<step>/c<call>/node-<N>/.lock).
RUN_LOCK_DEPTH = 3

_warned: set = set()
_fallbacks: Dict[Tuple[str, Optional[str]], str] = {}
_shares: Dict[str, int] = {}  # fallback base -> this process's shared hold on its IN_USE_FILE


def base_dir(tmp: Optional[str] = None) -> str:
    """``$TMPDIR/metaflow-torchrun-<uid>``, private: a symlink there is removed; another
    user's directory is left alone and a fallback used instead, with a warning."""
    path = os.path.join(tmp or tempfile.gettempdir(), "%s%d" % (BASE_PREFIX, uid()))
    check_parent(os.path.dirname(path))
    for _ in range(3):
        try:
            return make_private(path)
        except FileNotFoundError:
            continue  # removed under us: make it again
        except UnsafePath as e:
            try:
                if stat.S_ISLNK(os.lstat(path).st_mode):
                    os.unlink(path)
                    continue
            except FileNotFoundError:
                continue
            except OSError:
                pass
            return _fallback_base(path, e, tmp)
    return _fallback_base(path, UnsafePath(errno.EAGAIN, "keeps changing", path), tmp)


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


def _own_fallbacks(parent: str) -> List[str]:
    """The fallback bases in ``parent`` that are ours alone, by name: every node picks them in the same order."""
    try:
        names = sorted(n for n in os.listdir(parent) if n.startswith(_fallback_prefix()))
    except OSError:
        return []
    found = []
    for name in names:
        try:
            check_private_dir(os.path.join(parent, name))
            found.append(os.path.join(parent, name))
        except OSError:
            pass
    return found


def _reuse_fallback(tmp: Optional[str]) -> Optional[str]:
    """The first of our fallbacks, shared by every task (else each would make one no
    cleanup visits); the others go once nobody holds them."""
    found = _own_fallbacks(tmp or tempfile.gettempdir())
    for candidate in found[1:]:
        hold = _claim(candidate) if removable(candidate) else None
        if hold is not None:
            remove_fallback(candidate, hold)
    return found[0] if found else None


def _share(base: str) -> bool:
    """Hold a shared lock on ``base``'s ``IN_USE_FILE`` for the rest of this process, so
    no ``_claim`` empties it; False when the base is being emptied, or is gone."""
    if base in _shares:
        return True
    fd = _lock(base, fcntl.LOCK_SH)
    if fd is None:
        return False
    try:
        check_private_dir(base)
        if os.lstat(os.path.join(base, IN_USE_FILE)).st_ino != os.fstat(fd).st_ino:
            raise OSError(errno.ESTALE, "replaced", base)
    except OSError:
        os.close(fd)
        return False
    _shares[base] = fd
    return True


def _claim(base: str) -> Optional[int]:
    """An exclusive hold on a fallback base no live task uses, or None; one without
    ``IN_USE_FILE`` yet only once not young (its maker may be about to share it)."""
    if not os.path.lexists(os.path.join(base, IN_USE_FILE)) and not removable(base):
        return None
    fd = _lock(base, fcntl.LOCK_EX)
    if fd is not None and _calls_in_it(base):
        os.close(fd)
        return None
    return fd


def _lock(base: str, how: int) -> Optional[int]:
    """``base``'s ``IN_USE_FILE`` locked (``LOCK_SH`` or ``LOCK_EX``, never waiting), or None."""
    try:
        fd = open_private(os.path.join(base, IN_USE_FILE), os.O_RDWR | os.O_CREAT)
    except OSError:
        return None
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return None


def left_fallbacks(base: str) -> List[Tuple[str, int]]:
    """The fallback bases left beside ``base`` once it is the usual one again, each
    claimed for the caller to empty, then ``remove_fallback``."""
    parent, name = os.path.split(base)
    if name != "%s%d" % (BASE_PREFIX, uid()):
        return []
    claimed = [(candidate, _claim(candidate)) for candidate in _own_fallbacks(parent)]
    return [(candidate, hold) for candidate, hold in claimed if hold is not None]


def remove_fallback(base: str, hold: int, keep: bool = False) -> None:
    """Remove a claimed fallback base (``keep``: only let go of it)."""
    if not keep:
        shutil.rmtree(base, ignore_errors=True)
    release_lock(hold)


def _calls_in_it(base: str) -> bool:
    """Some live process holds a work directory or a run's logs in ``base``."""
    for sub in (WORK, LOGS):
        root = os.path.join(base, sub)
        try:
            names = os.listdir(root)
        except OSError:
            continue
        if any(in_use(os.path.join(root, name), RUN_LOCK_DEPTH) for name in names):
            return True
    return False
