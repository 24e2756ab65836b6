"""Which runs' per-rank logs a host keeps, as a pure function (the why:
docs/design.md, "Per-rank logs on a host"), and the ledger of their sizes, checked
against each directory's inode and mtime so a prune walks only the runs that changed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import AbstractSet, Dict, Iterable, List, NamedTuple

HOUR = 3600.0


@dataclass(frozen=True)
class RetentionPolicy:
    keep: int  # runs kept beyond the age, newest first
    hours: float  # a run used within this many hours is kept (but for space)
    max_bytes: int  # all runs' files together, at most
    young_seconds: float = 120.0  # a run used this recently is never removed


class RunLogs(NamedTuple):
    """One run's directory of per-rank logs (a tuple: a busy host has thousands)."""

    name: str
    last_used: float  # seconds since the epoch (the directory's mtime)
    size: int  # bytes of every file under it


@dataclass(frozen=True)
class Removal:
    run: RunLogs
    for_space: bool  # removed by the disk bound, not by age and count
    recent: bool  # used within the policy's hours


def is_recent(run: RunLogs, now: float, policy: RetentionPolicy) -> bool:
    """Used within ``policy.hours`` (a time stamp in the future counts too)."""
    return now - run.last_used < policy.hours * HOUR


def is_young(run: RunLogs, now: float, policy: RetentionPolicy) -> bool:
    """Used within ``young_seconds``, either way of the clock (a node may be making it now);
    a stamp far in the future is not, so a wrong clock cannot pin a run for ever."""
    return abs(now - run.last_used) < policy.young_seconds


def select_removals(
    runs: Iterable[RunLogs], now: float, policy: RetentionPolicy, protected: AbstractSet[str] = frozenset()
) -> List[Removal]:
    """The runs to remove, in order: those beyond both ``hours`` and the newest ``keep``,
    then the least recently used (recent ones included) while the rest pass ``max_bytes``.
    ``protected`` and young runs are never chosen, but count in size and rank."""
    newest_first = sorted(runs, key=lambda r: (-r.last_used, r.name))

    def pinned(run: RunLogs) -> bool:
        return run.name in protected or is_young(run, now, policy)

    removals: List[Removal] = []
    kept: List[RunLogs] = []
    for rank, run in enumerate(newest_first):
        if rank >= policy.keep and not is_recent(run, now, policy) and not pinned(run):
            removals.append(Removal(run, for_space=False, recent=False))
        else:
            kept.append(run)
    total = sum(run.size for run in kept)
    for run in reversed(kept):  # least recently used first
        if total <= policy.max_bytes:
            break
        if not pinned(run):
            removals.append(Removal(run, for_space=True, recent=is_recent(run, now, policy)))
            total -= run.size
    return removals


class Measured(NamedTuple):
    """A run directory's size, valid while its inode and mtime are these."""

    inode: int
    mtime_ns: int
    size: int


def is_run_name(name: str) -> bool:
    """A name a run directory may have: one path component, not hidden."""
    return bool(name) and "/" not in name and "\0" not in name and not name.startswith(".")


# A run name (is_run_name, no tab or newline), inode, mtime in ns, bytes (a busy host has thousands).
_LEDGER_LINE = re.compile(r"^([^\t\n/\0.][^\t\n/\0]*)\t(\d+)\t(\d+)\t(\d+)$", re.MULTILINE | re.ASCII)


def parse_ledger(text: str) -> Dict[str, Measured]:
    """The ledger's lines; anything else is skipped (a torn write costs a walk, never a wrong removal)."""
    return {m[0]: Measured(int(m[1]), int(m[2]), int(m[3])) for m in _LEDGER_LINE.findall(text)}


def format_ledger(entries: Dict[str, Measured]) -> str:
    return "".join(
        "%s\t%d\t%d\t%d\n" % (name, m.inode, m.mtime_ns, m.size)
        for name, m in sorted(entries.items())
        if is_run_name(name) and "\t" not in name and "\n" not in name
    )
