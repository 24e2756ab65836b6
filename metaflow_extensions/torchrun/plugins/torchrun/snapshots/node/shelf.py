"""The snapshots a node holds in its own memory, in slots, within a budget.

A slot is a sealed memfd (``snapshots/rank/memory.py``) the store maps and hands to a rank, which
writes a snapshot straight into it. Per key (``rank-R`` for a shard, ``local-L`` for replicated
state) the shelf keeps the newest two committed snapshots (the gang agrees on the newest step every
rank holds, and a rank killed while saving step S leaves the others holding S and S-1) and the
slot being written: three slots in the steady state, handed out again in turn, so a save makes no
memory and maps nothing new. A slot being written is no snapshot until it is committed (``finish``):
a writer killed half-way leaves the key's snapshots as they were, its slot back on the free list.

A snapshot is known by its start and its step (``Held``): the ranks' start (the gang's restart count)
that took it. Two starts can each leave a step S on different ranks (a rank killed in its save of S in
start k keeps k's S, while the others' saves of S in start k+1 replace theirs); a load resumes only from
a (start, step) every rank holds, so never from two timelines at once. Sharded keys name their world
size (``rank-R-of-W``): at a start of another size, ``drop_worlds`` returns the memory of the others.

Every slot counts against the budget from its creation, whatever it holds, so the budget holds
however often ranks save; to make room for a key its spare and oldest slots go, never its newest.
The budget (``budget``: the container's, not the host's) is decided for all the node's local ranks at
once (``plan``): they all save, or none does, said once. A step resumes only from a snapshot every rank
holds, so some ranks saving while the others were refused kept memory no restart could use.
A slot being read (a push, a fetch, a load: ``pin``) is neither reused nor closed until it is let go.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Dict, Iterable, List, Optional, Set, Tuple

from ..rank import memory, wire

KEEP = 2
SLOTS_PER_KEY = KEEP + 1  # the two kept and the one being written
_MB = 1 << 20


def megabytes(n: int) -> str:
    """A size for a person: bytes, KB, MB or GB."""
    if n < 10 * 1024:
        return "%d bytes" % n
    if n < _MB:
        return "%.1f KB" % (n / 1024)
    return "%.1f MB" % (n / _MB) if n < 1024 * _MB else "%.2f GB" % (n / (1024 * _MB))


Source = Tuple[int, int]  # (the peer's index in the store's peers, its node index)
Held = Tuple[int, int]  # a committed snapshot's identity: (the start that took it, its step)


class Slot:
    """One memfd and the store's mapping of it; ``step``/``size`` once it holds a committed snapshot."""

    def __init__(self, ident: int, capacity: int, key: str) -> None:
        self.id, self.capacity, self.key = ident, capacity, key
        self.fd = memory.create(capacity, "torchrun-snapshot-%d" % ident)
        try:
            self.map = memory.map_shared(self.fd, capacity)
        except BaseException:
            os.close(self.fd)
            raise
        self.step, self.size = -1, 0
        self.start = 0  # the ranks' start that took it (a peer's copy keeps the original's)
        self.saved_at = 0.0  # when it was committed here (wall clock): what a restart from it loses is after
        self.owner: Optional[int] = None  # the rank's connection writing it; None for a peer's copy
        self.source: Optional[Source] = None  # where a copy from a peer came from
        self.readers = 0
        self.doomed = False  # to be closed once its last reader lets go

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:
            pass  # a view of it is still alive somewhere: the mapping goes with that view
        memory.close_quietly(self.fd)


class Shelf:
    """Thread-safe: every rank's connection, the peers' and the pusher share it."""

    def __init__(self, budget: int, source: str = "") -> None:
        if budget < 0:
            raise ValueError("a snapshot budget is a number of bytes, not %d" % budget)
        self.budget = budget
        self.source = source  # where the budget came from, for a person
        self._off: Optional[str] = None  # the node's refusal, once made: every local rank's, for the call
        self._lock = threading.Lock()
        self._kept: Dict[str, List[Slot]] = {}  # oldest first
        self._writing: Dict[int, Slot] = {}  # slot id -> slot being written
        self._free: Dict[str, List[Slot]] = {}
        self._doomed: List[Slot] = []  # dropped while read: closed when let go
        self._planned: Dict[str, int] = {}  # key -> the bytes its rank needs (``plan``)
        self._ids = itertools.count(1)
        self._alive: Set[int] = set()

    def plan(self, key: str, size: int, pinned: int = 0, ranks: int = 1) -> Tuple[Optional[str], bool]:
        """(None if the node's ranks' snapshots fit, else why not; whether this call made the refusal). One
        decision for the node's ``ranks`` local ranks, each taken to need what the largest planned so far
        does: ``size``'s three slots here and ``pinned`` bytes of its own (its CUDA state's pinned buffers,
        memory of the same container). A refusal holds for every rank of the node from then on, and
        frees what its ranks hold: a step no rank can resume from is no use to keep."""
        need = SLOTS_PER_KEY * memory.room(size) + pinned
        with self._lock:
            if self._off is not None:
                return self._off, False
            each = max([need] + [n for k, n in self._planned.items() if k != key])
            count = max(ranks, len(set(self._planned) | {key}))
            if count * each <= self.budget:
                self._planned[key] = need
                return None, False
            self._off = refusal(size, pinned, count, count * each, self.budget, self.source)
            for own in list(self._planned) + [key]:
                self._forget(own)
            return self._off, True

    def _forget(self, key: str) -> None:
        for slot in self._kept.pop(key, []) + self._free.pop(key, []):
            self._drop(slot)

    def begin(self, key: str, size: int, owner: Optional[int] = None) -> Optional[Slot]:
        """A slot for ``size`` bytes to be written (by ``owner``'s rank, or a peer's copy), or None: over
        budget even with the key's spare and older slots dropped. A rank asking again for a key takes over
        the slot the key's earlier writer left unfinished (a rank restarted: its predecessor's is void)."""
        with self._lock:
            if owner is not None and self._off is not None:
                return None
            if owner is not None:
                for left in [s for s in self._writing.values() if s.key == key and s.owner is not None]:
                    self._release(left)
            slot = self._reusable(key, size) or self._new(key, size)
            if slot is None:
                return None
            slot.owner, slot.step, slot.size, slot.source = owner, -1, 0, None
            self._writing[slot.id] = slot
            return slot

    def _reusable(self, key: str, size: int) -> Optional[Slot]:
        free = self._free.get(key, [])
        for slot in free:
            if slot.readers == 0 and slot.capacity >= size:
                free.remove(slot)
                return slot
        return None

    def _new(self, key: str, size: int) -> Optional[Slot]:
        capacity = memory.room(size)
        self._make_room(key, capacity)
        if self._used() + capacity > self.budget:
            return None
        slot = Slot(next(self._ids), capacity, key)
        self._alive.add(slot.id)
        return slot

    def _make_room(self, key: str, capacity: int) -> None:
        for slot in list(self._free.get(key, [])):
            self._free[key].remove(slot)
            self._drop(slot)  # too small, or read now: a new one takes its place
        kept = self._kept.get(key, [])
        while self._used() + capacity > self.budget and len(kept) > 1:
            self._drop(kept.pop(0))

    def writing(self, ident: int, key: str, owner: Optional[int]) -> Optional[Slot]:
        """The slot ``ident`` if ``owner`` is writing it for ``key``; None otherwise (not its, or taken over)."""
        with self._lock:
            slot = self._writing.get(ident)
            return slot if slot is not None and slot.key == key and slot.owner == owner else None

    def finish(self, slot: Slot, step: int, size: int, source: Optional[Source] = None, start: int = 0) -> None:
        """The written slot becomes the key's newest, as ``start``'s ``step``; any of a step as late or later
        goes (a timeline the gang left), and the oldest beyond ``KEEP`` goes back to the free list for the
        key's next save."""
        with self._lock:
            if self._writing.pop(slot.id, None) is not slot or not 0 < size <= slot.capacity:
                raise ValueError("slot %d is not being written, or %d bytes do not fit it" % (slot.id, size))
            slot.step, slot.size, slot.source, slot.owner, slot.start = step, size, source, None, start
            slot.saved_at = time.time()
            if self._off is not None and source is None:  # a rank's save begun before the node's refusal
                self._drop(slot)
                return
            kept = self._kept.get(slot.key, [])
            for old in [h for h in kept if h.step >= step]:
                self._release(old, kept)
            kept.append(slot)
            while len(kept) > KEEP:
                self._release(kept[0], kept)
            self._kept[slot.key] = kept

    def abandon(self, slot: Slot) -> None:
        """A write that did not finish: its slot back to the free list, the key's snapshots untouched."""
        with self._lock:
            if self._writing.get(slot.id) is slot:
                self._release(slot)

    def abandon_owner(self, owner: int) -> None:
        """A rank's connection gone: whatever it was writing is void."""
        with self._lock:
            for slot in [s for s in self._writing.values() if s.owner == owner]:
                self._release(slot)

    def _release(self, slot: Slot, kept: Optional[List[Slot]] = None) -> None:
        """To the key's free list (at most one spare per key; another is closed)."""
        self._writing.pop(slot.id, None)
        if kept is not None:
            kept.remove(slot)
        slot.owner = None  # its step and size stay as they were for a reader that pinned it; ``begin`` resets them
        free = self._free.setdefault(slot.key, [])
        free.append(slot)
        while len(free) > 1:
            free.sort(key=lambda s: (s.readers == 0, s.capacity))
            self._drop(free.pop(0))

    def _drop(self, slot: Slot) -> None:
        self._alive.discard(slot.id)
        if slot.readers:
            slot.doomed = True
            self._doomed.append(slot)
        else:
            slot.close()

    def pin(self, key: str, step: Optional[int] = None, start: Optional[int] = None) -> Optional[Slot]:
        """The key's slot holding ``step`` (or its newest; of ``start`` alone where given), kept as it is until
        ``unpin``."""
        with self._lock:
            kept = self._kept.get(key, [])
            if step is None:
                slot = kept[-1] if kept else None
            else:
                slot = next((h for h in kept if h.step == step and start in (None, h.start)), None)
            if slot is not None:
                slot.readers += 1
            return slot

    def unpin(self, slot: Slot) -> None:
        with self._lock:
            slot.readers -= 1
            if slot.readers == 0 and slot.doomed:
                self._doomed.remove(slot)
                slot.close()

    def steps(self, key: str) -> List[int]:
        with self._lock:
            return [h.step for h in self._kept.get(key, [])]

    def held(self, key: str) -> List[Held]:
        """The key's snapshots as (start, step), oldest first."""
        with self._lock:
            return [(h.start, h.step) for h in self._kept.get(key, [])]

    def drop_worlds(self, world: int) -> int:
        """Every snapshot of a sharded key of another world size than ``world`` dropped, with its slots and its
        plan (a shard of 6 ranks' state is no shard of 4's, and holding it would let a gang grown back to 6
        resume from before it shrank); the bytes returned (a slot being read goes once let go)."""
        with self._lock:
            keys = {k for k in list(self._kept) + list(self._free) + list(self._planned)
                    if wire.world_of(k) not in (None, world)}
            keys.update(s.key for s in self._writing.values() if wire.world_of(s.key) not in (None, world))
            freed = 0
            for key in keys:
                gone = self._kept.pop(key, []) + self._free.pop(key, [])
                gone += [s for s in self._writing.values() if s.key == key]
                for slot in gone:
                    self._writing.pop(slot.id, None)
                    freed += slot.capacity
                    self._drop(slot)
                self._planned.pop(key, None)
            return freed

    def newest(self) -> Optional[int]:
        """The newest step held for any key (a timeline the gang left is dropped, so not counted)."""
        with self._lock:
            steps = [kept[-1].step for kept in self._kept.values() if kept]
            return max(steps) if steps else None

    def alive(self, ids: Iterable[int]) -> Set[int]:
        """Which of ``ids`` are slots still open (a rank unmaps the others)."""
        with self._lock:
            return {i for i in ids if i in self._alive}

    def arriving(self) -> int:
        """Snapshots being written now (a rank's, a peer's)."""
        with self._lock:
            return len(self._writing)

    @property
    def off(self) -> Optional[str]:
        """The node's refusal (its ranks keep no snapshots), once made."""
        with self._lock:
            return self._off

    def used(self) -> int:
        with self._lock:
            return self._used()

    def _used(self) -> int:
        return sum(s.capacity for s in self._slots()) + sum(s.capacity for s in self._doomed)

    def _slots(self) -> List[Slot]:
        return ([s for kept in self._kept.values() for s in kept] + list(self._writing.values())
                + [s for free in self._free.values() for s in free])

    def clear(self) -> None:
        """Every slot closed (a rank's mapping of one keeps its pages until it unmaps or exits)."""
        with self._lock:
            slots = self._slots() + self._doomed
            self._kept.clear()
            self._writing.clear()
            self._free.clear()
            self._doomed.clear()
            self._planned.clear()
            self._alive.clear()
            self._off = None
        for slot in slots:
            slot.close()


def refusal(size: int, pinned: int, ranks: int, need: int, budget: int, source: str) -> str:
    """The node's one refusal: both sizes, what the need is made of, and where the budget came from."""
    per_rank = "the newest two copies and the one being written, %s%s" % (
        megabytes(SLOTS_PER_KEY * memory.room(size)),
        "; its CUDA state's two pinned buffers, %s" % megabytes(pinned) if pinned else "")
    ranks_said = "each of this node's %d local ranks" % ranks if ranks > 1 else "this node's rank"
    return ("a snapshot of %s on %s needs %s of the node's memory in all (a rank: %s), and the node's snapshot "
            "budget is %s%s: no rank of this node keeps snapshots" % (
                megabytes(size), ranks_said, megabytes(need), per_rank, megabytes(budget),
                " (%s)" % source if source else ""))


def view(slot: Slot) -> memoryview:
    """The committed snapshot's bytes in the store's mapping (release it before the slot may close)."""
    return memoryview(slot.map)[:slot.size]

