"""Every path ``@torchrun`` writes on a node, private to the user who runs it.

Layout, under the temporary directory (``$TMPDIR``, else ``/tmp``)::

    metaflow-torchrun-<uid>/            0700, owned by <uid>, never a symlink
        logs/<flow>-<run id>/           one run's per-rank copies of the output,
            <step>-<task>-<attempt>/     kept by run (retention.py: KEEP_LOGS_HOURS
                c<call>/node-<N>/        after the run's last call here, then the
                    rank-<R>.stdout.log  newest KEEP_LOGS runs, at most MAX_LOG_MB)
                    rank-<R>.stderr.log
        logs/.ledger                    the sizes of the runs measured before
        logs/.pruning                   the lock under which calls prune and make
                                         their directories, one task at a time
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
host removes work directories nobody holds, so a killed task's leftovers go,
and never removes a run's logs while any of its calls holds one.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Set, Tuple

# The one module above host/ that host/ reads (a leaf: it imports nothing; pyproject.toml).
from ..procs.names import KEEP_LOGS_ENV, KEEP_LOGS_HOURS_ENV, MAX_LOG_MB_ENV
from .. import defaults as DEFAULTS
from .console import say
from .retention import (
    Measured,
    Removal,
    RetentionPolicy,
    RunLogs,
    format_ledger,
    is_run_name,
    parse_ledger,
    select_removals,
)

BASE_PREFIX = "metaflow-torchrun-"
LOGS = "logs"
WORK = "work"
LOCK_FILE = ".lock"
LEDGER_FILE = ".ledger"  # in logs/: the sizes of the runs measured before
PRUNE_LOCK_FILE = ".pruning"  # in logs/: calls prune and make their directories under it

# Retention of the per-rank logs, per user and host: the policy is retention.py's.
DEFAULT_KEEP_LOGS_HOURS = DEFAULTS.KEEP_LOGS_HOURS
DEFAULT_KEEP_LOGS = DEFAULTS.KEEP_LOGS
DEFAULT_MAX_LOG_MB = DEFAULTS.MAX_LOG_MB
# A directory this young is never pruned: another node of the same call
# (local runs put every node on one host) may be creating it right now.
YOUNG_SECONDS = 120.0
# How deep the lock of a call's logs lies below a run's directory
# (<step>/c<call>/node-<N>/.lock).
LOCK_DEPTH = 3
# Seconds a call waits for another task's prune on the host before it goes on
# without pruning (a prune takes milliseconds; 0.1 s at 10,000 runs).
PRUNE_WAIT = 10.0
# A ledger longer than this is not read (it is rebuilt by walking).
MAX_LEDGER_BYTES = 16 * 1024 * 1024

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
    if not _removable(base, time.time(), depth=0):  # its calls' locks are looked at below
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


def hold_lock(directory: str, name: str = LOCK_FILE) -> int:
    """Mark ``directory`` in use for as long as this process holds the returned
    fd (an exclusive ``flock``, released by the kernel even after a SIGKILL,
    and seen across PID namespaces that share the file system). Raises
    ``OSError`` when another process holds it."""
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


def _in_use(directory: str, depth: int = LOCK_DEPTH) -> bool:
    """Some live process holds the lock of ``directory`` or of a directory up
    to ``depth`` levels below it (a run's logs: ``<step>/c<call>/node-<N>``).
    Symbolic links are not followed."""
    if _lock_held(os.path.join(directory, LOCK_FILE)):
        return True
    if depth <= 0:
        return False
    try:
        with os.scandir(directory) as entries:
            below = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return False
    return any(_in_use(path, depth - 1) for path in below)


def _removable(path: str, now: float, depth: int = LOCK_DEPTH) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    return now - st.st_mtime >= YOUNG_SECONDS and not _in_use(path, depth)


# -- one call's files --------------------------------------------------------------


@dataclass(frozen=True)
class LogKey:
    """Where one call's per-rank logs go: ``logs/<run>/<step>/<call>/``. The
    run is what retention keeps or removes whole (retention.py); the names come
    from the gang's identity (``gang/identity.py``). Each part is one plain
    path component: never ``..``, a separator or a hidden name."""

    run: str  # <flow>-<run id>
    step: str  # <step>-<control task>-<attempt>
    call: str  # c<call index>

    def __post_init__(self) -> None:
        for part in (self.run, self.step, self.call):
            if not is_run_name(part) or os.sep in part:
                raise ValueError("not a plain directory name: %r" % (part,))


class CallFiles:
    """The work directory and the per-rank log directory of one call on this
    node, both held "in use" until ``close``, which removes the work directory
    (the logs stay, within the retention bound) and marks the run used now: a
    run's retention age counts from its last call's end."""

    def __init__(self, key: LogKey, node_index: int, base: Optional[str] = None):
        self.base = base or base_dir()
        self.work_dir = ""
        self.log_dir: Optional[str] = None
        self._run_dir = os.path.join(self.base, LOGS, key.run)
        self._locks: List[int] = []
        try:
            self.work_dir = make_work_dir(self.base)
            self._locks.append(hold_lock(self.work_dir))
            self.log_dir = call_log_dir(key, node_index, self.base)
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
        if self.log_dir is not None and self._locks:
            _touch(self._run_dir)
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
        if _removable(path, now, depth=0):  # a work directory's lock is at its top
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


# -- per-rank logs ---------------------------------------------------------------


def _env_number(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if math.isfinite(value) and value >= 0 else default


def retention_policy() -> RetentionPolicy:
    """The retention knobs as this task has them (settings.export_knobs puts a
    Metaflow profile's values in the environment)."""
    return RetentionPolicy(
        keep=int(_env_number(KEEP_LOGS_ENV, DEFAULT_KEEP_LOGS)),
        hours=_env_number(KEEP_LOGS_HOURS_ENV, DEFAULT_KEEP_LOGS_HOURS),
        max_bytes=int(_env_number(MAX_LOG_MB_ENV, DEFAULT_MAX_LOG_MB) * 1024 * 1024),
        young_seconds=YOUNG_SECONDS,
    )


def _touch(path: str) -> None:
    """Mark a run's logs used now (its retention age starts again)."""
    try:
        os.utime(path, follow_symlinks=False)
    except OSError:
        pass


def call_log_dir(key: LogKey, node_index: int, base: Optional[str] = None) -> Optional[str]:
    """``logs/<run>/<step>/<call>/node-<N>``, private; other runs' logs beyond
    the retention bound are removed first. None when no such directory can be
    made (the logs are a convenience, never a reason to fail the step)."""
    try:
        root = private_dir(os.path.join(base or base_dir(), LOGS))
        guard = _prune_guard(root)
        try:
            if guard is not None:  # else another task has been pruning for PRUNE_WAIT: it does the work
                prune_logs(root, retention_policy(), exclude=(key.run,))
            path = root
            for part in (key.run, key.step, key.call, "node-%d" % node_index):
                path = private_dir(os.path.join(path, part))
            _touch(os.path.join(root, key.run))  # young now: no prune takes it before our lock
            return path
        finally:
            release_lock(guard)
    except OSError:
        return None


def _prune_guard(root: str, wait: Optional[float] = None) -> Optional[int]:
    """The host's prune lock, waited for up to ``PRUNE_WAIT``: a task makes its
    call's directories under it, so no prune can remove a run (an old one
    getting a new call) between its choice and the new call's lock. None when
    it cannot be had."""
    deadline = time.monotonic() + (PRUNE_WAIT if wait is None else wait)
    while True:
        try:
            return hold_lock(root, PRUNE_LOCK_FILE)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)
        except OSError:
            return None


def step_log_dir(node_log_dir: str) -> str:
    """The directory of one step's logs on this host (every call, every node
    there), from one node's ``log_dir``."""
    return os.path.dirname(os.path.dirname(node_log_dir))


def where_logs_are(node_log_dir: str, policy: Optional[RetentionPolicy] = None) -> str:
    """The line that tells a local run's user where every rank's files are."""
    policy = policy or retention_policy()
    if policy.hours > 0:
        kept = "kept at least %g h" % policy.hours
    else:
        kept = "kept while among this host's newest %d runs" % policy.keep
    return "this step's per-rank log files on this host (%s, less if all logs here pass %g MB): %s" % (
        kept, policy.max_bytes / (1024 * 1024), step_log_dir(node_log_dir))


def _size(path: str) -> int:
    total = 0
    for top, _dirs, files in os.walk(path):  # never into a symbolic link
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                pass
    return total


def _read_ledger(root: str) -> Dict[str, Measured]:
    try:
        data = read_tail(os.path.join(root, LEDGER_FILE), MAX_LEDGER_BYTES + 1)
    except OSError:
        return {}
    if len(data) > MAX_LEDGER_BYTES:
        return {}
    return parse_ledger(data.decode("utf-8", errors="replace"))


def _write_ledger(root: str, entries: Dict[str, Measured]) -> None:
    """Replaced whole (rename), so a reader never sees half of it. Only the
    task holding the prune lock writes it."""
    tmp = os.path.join(root, LEDGER_FILE + ".tmp")
    try:
        fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            data = memoryview(format_ledger(entries).encode())
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(root, LEDGER_FILE))
    except OSError:
        pass


def _scan_runs(root: str) -> Tuple[List[RunLogs], Dict[str, Measured], bool]:
    """Every run directory of ours under ``root``, with its size: from the
    ledger where the directory has not changed since it was measured, else
    walked. Returns the runs, the ledger as it should now be, and whether that
    differs from the one on disk."""
    ledger = _read_ledger(root)
    measured: Dict[str, Measured] = {}
    runs: List[RunLogs] = []
    try:
        with os.scandir(root) as entries:
            found = [(e.name, e.path, e.stat(follow_symlinks=False)) for e in entries if is_run_name(e.name)]
    except OSError:
        return [], ledger, False
    uid = _uid()
    for name, path, st in found:
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            continue  # never counted, never removed: not a run directory of ours
        known = ledger.get(name)
        if known is None or (known.inode, known.mtime_ns) != (st.st_ino, st.st_mtime_ns):
            known = Measured(st.st_ino, st.st_mtime_ns, _size(path))
        measured[name] = known
        runs.append(RunLogs(name, st.st_mtime, known.size))
    return runs, measured, measured != ledger


def _choose(root: str, runs: List[RunLogs], now: float, policy: RetentionPolicy,
            exclude: Iterable[str]) -> List[Removal]:
    """``select_removals`` with the runs in use protected. Whether a run is in
    use costs a few opens, so it is asked only of the runs the policy would
    remove; a run found in use is protected and the choice made again (the disk
    bound may then take an older one)."""
    protected: Set[str] = set(exclude)
    asked: Set[str] = set(protected)
    while True:
        chosen = select_removals(runs, now, policy, frozenset(protected))
        unasked = [r.run.name for r in chosen if r.run.name not in asked]
        if not unasked:
            return chosen
        for name in unasked:
            asked.add(name)
            if _in_use(os.path.join(root, name)):
                protected.add(name)


def _say_removed_for_space(removals: List[Removal], policy: RetentionPolicy) -> None:
    recent = [r.run.name for r in removals if r.for_space and r.recent]
    if not recent:
        return
    names = ", ".join(recent[:5]) + (" and %d more" % (len(recent) - 5) if len(recent) > 5 else "")
    say("the per-rank logs on this host passed %s=%g: removed those of %d run%s used in the last %g h "
        "(least recently used first): %s" % (
            MAX_LOG_MB_ENV, policy.max_bytes / (1024 * 1024), len(recent), "" if len(recent) == 1 else "s",
            policy.hours, names))


def prune_logs(root: str, policy: RetentionPolicy, exclude: Iterable[str] = (),
               now: Optional[float] = None) -> List[str]:
    """Remove the runs' logs that ``policy`` lets go (retention.py), never
    those of a run in ``exclude`` or in use. Returns the removed paths. The
    caller holds the prune lock (``call_log_dir``), so one task prunes at a
    time and the ledger has one writer."""
    now = time.time() if now is None else now
    runs, measured, changed = _scan_runs(root)
    removals = _choose(root, runs, now, policy, exclude)
    removed: List[str] = []
    for removal in removals:
        path = os.path.join(root, removal.run.name)
        shutil.rmtree(path, ignore_errors=True)
        measured.pop(removal.run.name, None)
        removed.append(path)
    _say_removed_for_space(removals, policy)
    if changed or removed:
        _write_ledger(root, measured)
    return removed
