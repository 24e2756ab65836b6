"""One call's files on a node: its private work directory (``<base>/work/<pid>-<random>/``:
failure records, rank status, pickles, the entry file), held "in use" while the call runs
and removed when it ends (a killed task's, by the next call on the host), and its log directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import List, Optional, Tuple

from .basedir import WORK, base_dir
from ..base.knobs import Knobs
from .logs import LOGS, LogKey, call_log_dir, prune_other_runs, touch
from .private import hold_lock, private_dir, release_lock, removable


class CallFiles:
    """One call's work and log directories, held "in use" until ``close`` removes the work
    directory and marks the run used now (its retention age counts from its last call's end)."""

    def __init__(self, key: LogKey, node_index: int, base: Optional[str] = None, prune_first: bool = True,
                 knobs: Optional[Knobs] = None):
        """``base``: ``base_dir()`` as the step found it; found again if it has gone since."""
        self._key, self.knobs = key, knobs
        self._pruned = prune_first
        self.work_dir = ""
        self.log_dir: Optional[str] = None
        self._locks: List[int] = []
        try:
            self.base, self.work_dir = _work_dir_under(base, prune_first)
            self._run_dir = os.path.join(self.base, LOGS, key.run)
            self._locks.append(hold_lock(self.work_dir))
            self.log_dir = call_log_dir(key, node_index, self.base, prune=prune_first, knobs=knobs)
            if self.log_dir is not None:
                try:
                    self._locks.append(hold_lock(self.log_dir))
                except OSError:
                    pass
        except BaseException:
            self.close()
            raise

    def prune(self) -> None:
        """The pruning ``prune_first=False`` put off, once, when the caller chooses."""
        if not self._pruned:
            self._pruned = True
            prune_work_dirs(work_root(self.base))
            prune_other_runs(self._key, self.base, self.knobs)

    def close(self) -> None:
        remove_work_dir(self.work_dir)
        if self.log_dir is not None and self._locks:
            touch(self._run_dir)
        for fd in self._locks:
            release_lock(fd)
        self._locks = []

    def __enter__(self) -> "CallFiles":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class StepDir:
    """A private work directory of its own, held until ``close``: for what outlives one call (the step's warm
    process) or serves a call beside its ranks (its snapshot store's socket). One a killed task left is swept
    as any work directory is."""

    def __init__(self, base: Optional[str] = None):
        self.path = make_work_dir(base, prune=False)
        try:
            self._lock: Optional[int] = hold_lock(self.path)
        except BaseException:
            remove_work_dir(self.path)
            raise

    def close(self) -> None:
        remove_work_dir(self.path)
        release_lock(self._lock)
        self._lock = None


def _work_dir_under(base: Optional[str], prune: bool) -> Tuple[str, str]:
    """The base and a fresh work directory in it; a base gone since (a tmp cleaner) is found again."""
    if base:
        try:
            return base, make_work_dir(base, prune=prune)
        except FileNotFoundError:
            pass
    base = base_dir()
    return base, make_work_dir(base, prune=prune)


def work_root(base: Optional[str] = None) -> str:
    return private_dir(os.path.join(base or base_dir(), WORK))


def make_work_dir(base: Optional[str] = None, prune: bool = True) -> str:
    """A fresh private work directory; those of tasks gone removed first, unless the caller prunes later."""
    root = work_root(base)
    if prune:
        prune_work_dirs(root)
    return tempfile.mkdtemp(prefix="%d-" % os.getpid(), dir=root)


def remove_work_dir(path: Optional[str]) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


def prune_work_dirs(root: str) -> List[str]:
    """Remove the work directories no live process holds (their lock is at their top)."""
    try:
        paths = [os.path.join(root, name) for name in os.listdir(root)]
    except OSError:
        return []
    removed = [path for path in paths if removable(path)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed
