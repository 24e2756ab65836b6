"""The snapshots a node holds in its own memory, within a budget.

Per key (``rank-R`` for a shard, ``local-L`` for replicated state) the newest complete snapshot
and the one before it: the gang agrees on the newest step every rank holds, and a rank killed
while saving step S leaves the others holding S and S-1. A snapshot arriving is counted against
the budget before its first byte is read (``begin``), so what is held plus what is arriving never
passes it, however often ranks save; to make room the key's oldest is dropped, never its newest.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

KEEP = 2
_MB = 1 << 20


def megabytes(n: int) -> str:
    """A size for a person: bytes, KB, MB or GB."""
    if n < 10 * 1024:
        return "%d bytes" % n
    if n < _MB:
        return "%.1f KB" % (n / 1024)
    return "%.1f MB" % (n / _MB) if n < 1024 * _MB else "%.2f GB" % (n / (1024 * _MB))


def default_budget(fraction: float = 0.25, meminfo: str = "/proc/meminfo") -> int:
    """A quarter of the memory the host has available now (1 GiB where that cannot be read)."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(int(line.split()[1]) * 1024 * fraction)
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 30


@dataclass(frozen=True)
class Held:
    """One complete snapshot's bytes; ``digest`` is its last 32 bytes, as its writer sealed it."""

    key: str
    step: int
    blob: bytearray

    @property
    def size(self) -> int:
        return len(self.blob)

    @property
    def digest(self) -> bytes:
        return bytes(self.blob[-32:])


class Shelf:
    """Thread-safe: every rank's connection, the peers' and the pusher share it."""

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError("a snapshot budget is a number of bytes, not %d" % budget)
        self.budget = budget
        self._lock = threading.Lock()
        self._kept: Dict[str, List[Held]] = {}  # oldest first
        self._arriving: Dict[int, Tuple[str, int]] = {}  # ticket -> (key, size)
        self._planned: Dict[str, int] = {}  # key -> the size its rank said it saves
        self._tickets = itertools.count(1)

    def plan(self, key: str, size: int) -> Optional[str]:
        """None if a key's snapshots of ``size`` fit (one kept, one arriving); else why not, both sizes named."""
        with self._lock:
            others = sum(2 * s for k, s in self._planned.items() if k != key)
            if others + 2 * size > self.budget:
                return ("a snapshot of %s needs %s in this node's memory (the newest complete copy and the next "
                        "arriving), and the node's snapshot budget is %s%s"
                        % (megabytes(size), megabytes(2 * size), megabytes(self.budget),
                           ", %s of it planned for other ranks" % megabytes(others) if others else ""))
            self._planned[key] = size
            return None

    def begin(self, key: str, size: int) -> Optional[int]:
        """A ticket for ``size`` bytes arriving, or None: over budget even with the key's older copies dropped."""
        with self._lock:
            kept = self._kept.get(key, [])
            while self._used() + size > self.budget and len(kept) > 1:
                kept.pop(0)
            if self._used() + size > self.budget:
                return None
            ticket = next(self._tickets)
            self._arriving[ticket] = (key, size)
            return ticket

    def finish(self, ticket: int, step: int, blob: bytearray) -> Held:
        """The arrived snapshot replaces any of a step as late or later (a timeline the gang left)."""
        with self._lock:
            key, size = self._arriving.pop(ticket)
            if size != len(blob):
                raise ValueError("ticket %d was for %d bytes, not %d" % (ticket, size, len(blob)))
            held = Held(key, step, blob)
            kept = [h for h in self._kept.get(key, []) if h.step < step] + [held]
            self._kept[key] = kept[-KEEP:]
            return held

    def abandon(self, ticket: int) -> None:
        with self._lock:
            self._arriving.pop(ticket, None)

    def steps(self, key: str) -> List[int]:
        with self._lock:
            return [h.step for h in self._kept.get(key, [])]

    def get(self, key: str, step: Optional[int] = None) -> Optional[Held]:
        """The key's snapshot of ``step``, or its newest."""
        with self._lock:
            kept = self._kept.get(key, [])
            if step is None:
                return kept[-1] if kept else None
            return next((h for h in kept if h.step == step), None)

    def arriving(self) -> int:
        """Snapshots being received now (a rank's, a peer's)."""
        with self._lock:
            return len(self._arriving)

    def used(self) -> int:
        with self._lock:
            return self._used()

    def _used(self) -> int:
        return (sum(h.size for kept in self._kept.values() for h in kept)
                + sum(size for _, size in self._arriving.values()))

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._arriving.clear()
            self._planned.clear()
