"""The per-rank logs on a node: where each call's go, how long they stay (retention.py).
Under this user's base directory (basedir.py)::

    logs/<flow>-<run id>/               one run's per-rank logs, kept as a whole (retention.py)
        <step>-<task>-<attempt>/c<call>/node-<N>/rank-<R>.{stdout,stderr}.log
    logs/.ledger                        the sizes of the runs measured before
    logs/.pruning                       the lock under which calls prune and make their directories

A call prunes under the prune lock, never a run any call holds, after bringing
in the runs a squat left in a fallback base.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Set, Tuple

from ..base.knobs import MAX_LOG_MB_ENV, Knobs
from ..base.text import count
from . import private
from .basedir import LOGS, RUN_LOCK_DEPTH, left_fallbacks, remove_fallback
from .console import say
from .private import hold_lock, in_use, open_private, private_dir, read_tail, release_lock
from .retention import Measured, Removal, RetentionPolicy, RunLogs, format_ledger, is_run_name, parse_ledger
from .retention import select_removals

LEDGER_FILE = ".ledger"
PRUNE_LOCK_FILE = ".pruning"
PRUNE_WAIT = 10.0  # for another task's prune, then go on without (a prune takes 0.1 s at 10,000 runs)
MAX_LEDGER_BYTES = 16 * 1024 * 1024  # a longer ledger is not read (it is rebuilt by walking)


@dataclass(frozen=True)
class LogKey:
    """Where one call's per-rank logs go (names from ``gang/identity.py``), each part one plain path component."""

    run: str  # <flow>-<run id>
    step: str  # <step>-<control task>-<attempt>
    call: str  # c<call index>

    def __post_init__(self) -> None:
        for part in (self.run, self.step, self.call):
            if not is_run_name(part) or os.sep in part:
                raise ValueError("not a plain directory name: %r" % (part,))


def retention_policy(knobs: Optional[Knobs] = None) -> RetentionPolicy:
    knobs = knobs or Knobs()
    return RetentionPolicy(keep=knobs.keep_logs, hours=knobs.keep_logs_hours,
                           max_bytes=int(knobs.max_log_mb * 1024 * 1024), young_seconds=private.YOUNG_SECONDS)


def touch(path: str) -> None:
    """Mark a run's logs used now: its retention age starts again."""
    try:
        os.utime(path, follow_symlinks=False)
    except OSError:
        pass


def call_log_dir(key: LogKey, node_index: int, base: str, prune: bool = True,
                 knobs: Optional[Knobs] = None) -> Optional[str]:
    """``logs/<run>/<step>/<call>/node-<N>``, private, after pruning other runs' unless
    ``prune`` is False (``prune_other_runs`` then does it off the critical path). None
    when it cannot be made: the logs are a convenience, never a reason to fail the step."""
    try:
        root = private_dir(os.path.join(base, LOGS))
        guard = _prune_guard(root)
        try:
            if guard is not None and prune:  # else another task has been pruning for PRUNE_WAIT
                _prune(base, root, key, knobs)
            path = root
            for part in (key.run, key.step, key.call, "node-%d" % node_index):
                path = private_dir(os.path.join(path, part))
            touch(os.path.join(root, key.run))  # young now: no prune takes it before our lock
            return path
        finally:
            release_lock(guard)
    except OSError:
        return None


def prune_other_runs(key: LogKey, base: str, knobs: Optional[Knobs] = None) -> None:
    """The prune ``call_log_dir`` skipped, once the call's agent has started."""
    try:
        root = private_dir(os.path.join(base, LOGS))
        guard = _prune_guard(root)
        if guard is not None:
            try:
                _prune(base, root, key, knobs)
            finally:
                release_lock(guard)
    except OSError:
        pass


def _prune(base: str, root: str, key: LogKey, knobs: Optional[Knobs]) -> None:
    adopt_fallbacks(base, root)
    prune_logs(root, retention_policy(knobs), exclude=(key.run,))


def _prune_guard(root: str) -> Optional[int]:
    """The host's prune lock, waited for up to ``PRUNE_WAIT``, or None. A task makes its
    call's directories under it: no prune removes a run between its choice and the call's lock."""
    deadline = time.monotonic() + PRUNE_WAIT
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
    """One step's logs on this host (every call, every node), from one node's ``log_dir``."""
    return os.path.dirname(os.path.dirname(node_log_dir))


def where_logs_are(node_log_dir: str, policy: RetentionPolicy) -> str:
    """The line that tells a local run's user where every rank's files are."""
    kept = ("kept at least %g h" % policy.hours if policy.hours > 0
            else "kept while among this host's newest %d runs" % policy.keep)
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
    return parse_ledger(data.decode("utf-8", errors="replace")) if len(data) <= MAX_LEDGER_BYTES else {}


def _write_ledger(root: str, entries: Dict[str, Measured]) -> None:
    """Replaced whole (rename): a reader never sees half of it."""
    tmp = os.path.join(root, LEDGER_FILE + ".tmp")
    try:
        with open(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
            f.write(format_ledger(entries).encode())
        os.replace(tmp, os.path.join(root, LEDGER_FILE))
    except OSError:
        pass


def _scan_runs(root: str) -> Tuple[List[RunLogs], Dict[str, Measured], bool]:
    """Every run directory of ours under ``root`` with its size (the ledger's where the
    directory has not changed, else walked), the ledger as it should be, and whether it changed."""
    ledger = _read_ledger(root)
    measured: Dict[str, Measured] = {}
    runs: List[RunLogs] = []
    try:
        with os.scandir(root) as entries:
            found = [(e.name, e.path, e.stat(follow_symlinks=False)) for e in entries if is_run_name(e.name)]
    except OSError:
        return [], ledger, False
    uid = private.uid()
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
    """``select_removals`` with the runs in use protected: only the runs it would remove
    are asked (a few opens each); one in use is protected and the choice made again."""
    protected: Set[str] = set(exclude)
    asked: Set[str] = set(protected)
    while True:
        chosen = select_removals(runs, now, policy, frozenset(protected))
        unasked = [r.run.name for r in chosen if r.run.name not in asked]
        if not unasked:
            return chosen
        for name in unasked:
            asked.add(name)
            if in_use(os.path.join(root, name), RUN_LOCK_DEPTH):
                protected.add(name)


def _say_removed_for_space(removals: List[Removal], policy: RetentionPolicy) -> None:
    recent = [r.run.name for r in removals if r.for_space and r.recent]
    if not recent:
        return
    names = ", ".join(recent[:5]) + (" and %d more" % (len(recent) - 5) if len(recent) > 5 else "")
    say("the per-rank logs on this host passed %s=%g: removed those of %s used in the last %g h "
        "(least recently used first): %s" % (
            MAX_LOG_MB_ENV, policy.max_bytes / (1024 * 1024), count(len(recent), "run"), policy.hours, names))


def prune_logs(root: str, policy: RetentionPolicy, exclude: Iterable[str] = (),
               now: Optional[float] = None) -> List[str]:
    """Remove the runs' logs ``policy`` lets go, never one in ``exclude`` or in use; the
    removed paths. The caller holds the prune lock: the ledger has one writer."""
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


def adopt_fallbacks(base: str, root: str) -> None:
    """The runs' logs in the fallback bases a squat left, moved under ``root`` (a name
    taken gets the fallback's suffix), then each fallback removed unless some stayed."""
    for fallback, hold in left_fallbacks(base):
        left = False
        source = os.path.join(fallback, LOGS)
        try:
            names = sorted(n for n in os.listdir(source) if is_run_name(n))
        except OSError:
            names = []
        for name in names:
            path = os.path.join(source, name)
            try:
                st = os.lstat(path)
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != private.uid():
                    continue  # never ours to keep: goes with the fallback
                target = os.path.join(root, name)
                if os.path.lexists(target):
                    target = "%s-%s" % (target, os.path.basename(fallback).rsplit("-", 1)[-1])
                os.rename(path, target)
            except OSError:
                left = True
        remove_fallback(fallback, hold, keep=left)
