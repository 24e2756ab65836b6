"""Which runs' per-rank logs a host keeps: the policy, as a pure function.

The policy, in one sentence (docs/seeing-the-gang.md says it to users): a
run's per-rank files stay on a host for at least ``hours`` after its last call
there, whatever other flows do on the host; beyond that only the newest
``keep`` runs stay; and while all runs' files take more than ``max_bytes``,
the least recently used runs go first, recent ones included (the task says so),
never one that is running or that was used in the last ``young_seconds``.

Why a run, and why an age:

- A user looks for a run's files after the run: "what did rank 5 print?". A
  bound counted in calls, per host and across flows (what there was before),
  let a busy host evict a run within an hour. An age is what a user can plan
  on, and it does not depend on what others run; the count only trims what
  is already older than the age.
- The unit is the run because that is what a user asks about, and one run's
  steps, retries and calls then live or go together: never half a run.
- The age counts from the run's last use on the host (its directory's
  modification time, which every call's start and end touches), so a run
  that ran for days is as recent as the moment it ended.
- Disk space still wins over age: a full ``/tmp`` fails every task on the
  host, which is worse than a lost log. It removes the least recently used
  runs first, and says so when one of them is recent, so a missing file is
  never a mystery.
- A run in use or just made is never removed: its task is writing there, or
  another node of the same local run is making it right now.

``select_removals`` takes each run's metadata and the time, and nothing else:
the caller (``logs.prune_logs``) reads the directories, knows which runs
are in use, and removes. The sizes of runs the host measured before come from
a small ledger (``parse_ledger``/``format_ledger``), checked against each run
directory's inode and modification time, so a prune walks only the runs that
changed since: its cost is one ``lstat`` per run, not one per file.
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
    """One run's directory of per-rank logs on this host (a tuple: a busy host
    has thousands, made at every call's start)."""

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
    """Used within ``young_seconds``, either way of the clock: some node may be
    making it right now. A stamp far in the future is not young, so a clock
    that was wrong once cannot pin a run for ever."""
    return abs(now - run.last_used) < policy.young_seconds


def select_removals(
    runs: Iterable[RunLogs], now: float, policy: RetentionPolicy, protected: AbstractSet[str] = frozenset()
) -> List[Removal]:
    """The runs to remove, in order: first those beyond both the age and the
    newest ``keep``, then, while the rest take more than ``max_bytes``, the
    least recently used. ``protected`` (runs in use, the caller's own) and
    young runs are never chosen, but count in the size and the ranking."""
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


# -- the ledger of measured sizes -------------------------------------------------


class Measured(NamedTuple):
    """A run directory's size, valid while its inode and mtime are these."""

    inode: int
    mtime_ns: int
    size: int


def is_run_name(name: str) -> bool:
    """A name a run directory may have: one path component, not hidden."""
    return bool(name) and "/" not in name and "\0" not in name and not name.startswith(".")


# One line: a run name (is_run_name, and no tab or newline), then inode, mtime in
# ns and bytes as ASCII digits. A regular expression: the ledger of a busy host
# has thousands of lines, read at every call's start.
_LEDGER_LINE = re.compile(r"^([^\t\n/\0.][^\t\n/\0]*)\t(\d+)\t(\d+)\t(\d+)$", re.MULTILINE | re.ASCII)


def parse_ledger(text: str) -> Dict[str, Measured]:
    """``name<TAB>inode<TAB>mtime_ns<TAB>bytes`` lines; anything else is
    skipped (the file is ours, but a torn write or an older format must only
    cost a walk, never a wrong removal or an error)."""
    return {m[0]: Measured(int(m[1]), int(m[2]), int(m[3])) for m in _LEDGER_LINE.findall(text)}


def format_ledger(entries: Dict[str, Measured]) -> str:
    return "".join(
        "%s\t%d\t%d\t%d\n" % (name, m.inode, m.mtime_ns, m.size)
        for name, m in sorted(entries.items())
        if is_run_name(name) and "\t" not in name and "\n" not in name
    )
