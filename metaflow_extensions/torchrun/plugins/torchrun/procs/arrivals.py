"""When this rank reached its collectives, read from torch's Flight Recorder while it trains, so the gang
can tell which rank the others wait for (gang/arrivals.py).

In a lockstep job every rank leaves a collective together, so step rates cannot tell the ranks apart;
the moment each rank *enqueued* the collective can: the rank the others wait for is the last to arrive.
The recorder stamps each entry with that moment (``time_created_ns``, the host's wall clock), for gloo
and NCCL alike. A daemon thread dumps the recorder every ``EVERY`` seconds and writes the rank's
``rank-<R>.arrivals.json``; nothing is done where the recorder is off or the group is not up yet. Every
process group the rank is in is read (``group_sizes``: a tensor- or data-parallel group of a few ranks
as well as the default one), in the recorder of the default group's backend; point-to-point operations
(a pipeline's sends and receives) are no collective, and are not.

What is kept is *pairs*: two successive collectives ``k-1`` and ``k`` of a group, the unit the gang's
cost is worked out on (gang/arrival_cost.py). An FSDP job makes hundreds of collectives a second, more
than a node's heartbeat can carry, so one pair in ``2**level`` is kept, by a hash of ``k`` that every
rank computes alike (``sampled``): the level is the least that keeps about ``TARGET`` pairs a second, and
a rank on one level keeps every pair of the levels above, so ranks that chose levels one apart still
share the coarser one's pairs. The hash, not ``k``'s own bits, picks them: a step's collectives repeat
with a period, and every pair of a period must be as likely to be kept. Only the entries of kept pairs
are parsed, the newest first, back to the last read (a whole ``json.loads`` of 2,000 entries cost as
much as torch's dump, and set off Python's garbage collector): the dump itself is the cost, and ``EVERY``
keeps it near 1 % of the rank's time (docs/benchmarks.md, "Who the gang waits for")."""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

from .flight_ask import default_backends, dump_recorder, recorder_for
from .names import ARRIVALS_SUFFIX, RESTART_COUNT_ENV, rank_file
from .records import read_json, write_json

EVERY = 5.0  # seconds between two reads of the recorder: a full one's dump takes torch 30 to 40 ms (2,000 entries)
# ... or less where the collectives come faster than the recorder keeps them for: its newest this share read
# again before it goes round (at 2,000 entries and 400 collectives a second, every 3.75 s; the cost grows with
# the rate, not with the recorder's size: docs/benchmarks.md).
ROUND = 0.75
KEPT = 256  # pairs a rank's file holds for each group, the newest: 21 s at the most kept (12 a second)
TARGET = 12.0  # pairs a second kept, at most (6 to 12): a node's heartbeat carries 48 every 3 s (gang/arrivals.py)
MAX_LEVEL = 24
STAY = 1.25  # a level changes where the rate is this far past its bound
MAX_GROUPS = 8  # process groups read, the default first (gang/arrivals.py's records hold as many)
FIRST = 256  # entries a rank's first read takes, the newest
HOST = "host"  # an arrival is the host's enqueue time (time_created_ns)
DEVICE = "device"  # ... or when the collective began on the device (NCCL with TORCH_NCCL_ENABLE_TIMING=1)
CLOCKS = (HOST, DEVICE)

# How torch writes an entry: its keys in order, this one first (elsewhere: the whole dump parsed).
_ENTRY = '{"collective_seq_id"'
_START = re.compile(r'\{"collective_seq_id": ?(\d+),')
_RECORD = re.compile(r'"record_id": ?(\d+)')
_DECODER = json.JSONDecoder()
_MASK = (1 << 64) - 1


def level(k: int) -> int:
    """How rare pair ``k`` is: the trailing zero bits of a 64-bit mix of ``k`` (splitmix64's), so that one
    pair in ``2**n`` has a level of ``n`` or more, whatever the step's period."""
    z = (k * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    z ^= z >> 31
    return MAX_LEVEL if z == 0 else min(MAX_LEVEL, (z & -z).bit_length() - 1)


def level_for(rate: float, target: Optional[float] = None) -> int:
    """The least level that keeps at most ``target`` (``TARGET``) of ``rate`` pairs a second."""
    target = TARGET if target is None else target
    found = 0
    while found < MAX_LEVEL and rate / (1 << found) > target:
        found += 1
    return found


def settled(now: int, rate: float, target: Optional[float] = None) -> int:
    """The level for ``rate``, kept where the rate is within ``STAY`` of the bound it crossed: ranks (and
    nodes) whose estimates differ a little keep the same pairs."""
    if level_for(rate / STAY, target) > now or level_for(rate * STAY, target) < now:
        return level_for(rate, target)
    return now


def new_entries(text: Any, after: int, wanted: Callable[[int], bool],
                most: Optional[int] = None) -> Tuple[List[Any], int, int]:
    """The dump's entries recorded after record ``after`` (at most the newest ``most``) whose
    ``collective_seq_id`` is ``wanted``, parsed each alone, oldest first; the newest record id and how many
    were new. Where the dump is not written as torch writes it, every entry is parsed."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        return [], after, 0
    starts = _backwards(text)
    first = next(starts, None)
    if first is None:
        return _after(_all_entries(text), after, wanted)
    last = _RECORD.search(text, first[0])
    if last is not None and int(last.group(1)) < after:
        after = -1  # the recorder began again (torch's reset): every entry is new
    out: List[Any] = []
    newest, count = after, 0
    for at, seq in itertools.chain([first], starts):
        found = _RECORD.search(text, at, at + 100_000)
        record = int(found.group(1)) if found else -1
        if record <= after or count == most:
            break
        newest, count = max(newest, record), count + 1
        if wanted(seq):
            try:
                out.append(_DECODER.raw_decode(text, at)[0])
            except ValueError:
                continue
    out.reverse()
    return out, newest, count


def _backwards(text: str) -> Iterator[Tuple[int, int]]:
    """Each entry's (offset, sequence number), the newest first: a read stops at the last one it read
    before, so it scans the dump's tail, not all of it."""
    end = len(text)
    while True:
        at = text.rfind(_ENTRY, 0, end)
        if at < 0:
            return
        found = _START.match(text, at)
        if found is not None:
            yield at, int(found.group(1))
        end = at


def _after(entries: List[Any], after: int, wanted: Callable[[int], bool]) -> Tuple[List[Any], int, int]:
    new = [e for e in entries if isinstance(e, dict) and type(e.get("record_id")) is int and e["record_id"] > after]
    newest = max([after] + [e["record_id"] for e in new])
    kept = [e for e in new if type(e.get("collective_seq_id")) is int and wanted(e["collective_seq_id"])]
    return kept, newest, len(new)


def _entries_in(text: Any) -> int:
    """How many entries the dump holds: the recorder's size, once it has gone round."""
    if isinstance(text, bytes):
        return text.count(_ENTRY.encode())
    return text.count(_ENTRY) if isinstance(text, str) else 0


def _all_entries(text: str) -> List[Any]:
    try:
        found = json.loads(text).get("entries")
    except (ValueError, AttributeError):
        return []
    return found if isinstance(found, list) else []


def group_sizes(dist: Any) -> Dict[str, int]:
    """Every process group this rank is in with another rank, by torch's name (the recorder's): its size;
    at most ``MAX_GROUPS``, the default group first. Where torch keeps them elsewhere, the default group."""
    default = dist.distributed_c10d._get_default_group()
    found = {str(default.group_name): int(default.size())}
    try:
        for group, name in dist.distributed_c10d._world.pg_names.items():
            found.setdefault(str(name), int(group.size()))
    except Exception:
        pass  # another torch's layout: the default group alone
    kept = [str(default.group_name)] + sorted(n for n in found if n != str(default.group_name))
    return {n: found[n] for n in kept[:MAX_GROUPS] if found[n] >= 2}


def arrivals_path(directory: str, rank: int) -> str:
    return rank_file(directory, rank, ARRIVALS_SUFFIX)


def device_ns(entry: Any) -> Optional[int]:
    """When the collective began on this rank's device, ns: its end as NCCL's watchdog found it, less the
    kernel's own time (``duration_ms``, from CUDA events: NCCL with ``TORCH_NCCL_ENABLE_TIMING=1``), else
    its start as the watchdog found it. Both are found late, by up to the watchdog's poll. None where
    neither is known: gloo, NCCL without timing, a collective still in flight."""
    if not isinstance(entry, dict):
        return None
    done, took = entry.get("time_discovered_completed_ns"), entry.get("duration_ms")
    if type(done) is int and done > 0 and isinstance(took, (int, float)) and not isinstance(took, bool) \
            and 0 <= took < done / 1e6:
        return done - int(took * 1e6)
    began = entry.get("time_discovered_started_ns")
    return began if type(began) is int and began > 0 else None


def arrival(entry: Any, clock: str = HOST) -> Optional[Tuple[str, int, int]]:
    """(group's name, sequence number, arrived at in ns) of a collective as torch writes it, on ``clock``;
    None for another entry (point-to-point, not torch's shape) and for a device time not known yet."""
    if not isinstance(entry, dict) or entry.get("is_p2p"):
        return None
    group = entry.get("process_group")
    seq, at = entry.get("collective_seq_id"), entry.get("time_created_ns") if clock == HOST else device_ns(entry)
    if not (isinstance(group, list) and len(group) == 2 and isinstance(group[0], str)):
        return None
    if type(seq) is int and type(at) is int and seq > 0 and at > 0:
        return str(group[0]), seq, at
    return None


class ArrivalWatch:
    """The rank's reader: its thread, and the pairs written so far."""

    def __init__(self, directory: str, rank: int, every: float = EVERY) -> None:
        self.path = arrivals_path(directory, rank)
        self.rank = rank
        self.every = every
        self.wait = every  # until the next read: less where the recorder goes round sooner
        self.pairs: Dict[str, List[Tuple[int, int, int]]] = {}  # group -> (k, arrived at k-1, at k), oldest first
        self.before: Dict[Tuple[str, int], int] = {}  # the last read's arrivals a later pair may need
        self.record = -1  # the newest recorder entry read
        self.clock = HOST  # DEVICE once the recorder has the device's own times
        self.level = 0
        self.read_at: Optional[float] = None
        self.stop = threading.Event()
        text = os.environ.get(RESTART_COUNT_ENV, "0")
        self.of_start = int(text) if text.isdigit() else 0  # the start of the ranks this one belongs to

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="torchrun-arrivals", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        while not self.stop.wait(self.wait):
            try:
                self.read_once(sys.modules.get("torch.distributed"), sys.modules.get("torch._C._distributed_c10d"))
            except Exception:
                return  # best effort: a recorder that cannot be read is not read again

    def wanted(self, seq: int) -> bool:
        return level(seq) >= self.level or level(seq + 1) >= self.level

    def read_once(self, dist: Any, c10d: Any, now: Optional[float] = None) -> bool:
        """Whether new pairs were written."""
        if dist is None or c10d is None or not dist.is_available() or not dist.is_initialized():
            return False
        if dist.get_world_size() < 2:
            self.stop.set()  # nobody waits for anybody
            return False
        text, _ = dump_recorder(c10d, recorder_for(default_backends(dist)))
        if text is None:
            self.stop.set()
            return False
        return self.take(text, group_sizes(dist), time.monotonic() if now is None else now)

    def take(self, text: Any, sizes: Dict[str, int], now: float) -> bool:
        """The dump's new pairs, kept and written; the level set again from the rate they came at."""
        # The first read takes the newest FIRST only: a full recorder's every entry parsed was 0.2 s.
        entries, newest, count = new_entries(text, self.record, self.wanted, FIRST if self.record < 0 else None)
        self.record = self._clock(entries, newest)
        found = [a for a in (arrival(e, self.clock) for e in entries) if a is not None and a[0] in sizes]
        self._pace(count, found, _entries_in(text), now)
        times = dict(self.before)
        times.update({(g, k): at for g, k, at in found})
        added = self._pairs(times)
        last: Dict[str, int] = {}
        for group, k in times:
            last[group] = max(k, last.get(group, k))
        self.before = {(g, k): times[g, k] for g, k in last.items() if level(k + 1) >= self.level}
        if added:
            write_json(self.path, {"rank": self.rank, "start": self.of_start, "clock": self.clock,
                                   "groups": {g: {"size": sizes[g], "pairs": [list(p) for p in pairs]}
                                              for g, pairs in self.pairs.items() if g in sizes}})
        return added

    def _pace(self, count: int, found: List[Tuple[str, int, int]], ring: int, now: float) -> None:
        """The level, and the wait till the next read, from the rate new entries came at."""
        span = (found[-1][2] - found[0][2]) / 1e9 if len(found) > 1 else 0.0
        if self.read_at is not None and now > self.read_at:
            rate = count / (now - self.read_at)
        else:
            rate = count / span if span >= 1.0 else 0.0  # the first read: the recorder's own times
        if rate:
            self.level = settled(self.level, rate)
            self.wait = min(self.every, max(self.every / 5, ROUND * ring / rate)) if ring else self.every
        self.read_at = now

    def _clock(self, entries: List[Any], newest: int) -> int:
        """The device's own times from the first read that has them (the pairs on the host's before are
        dropped: one clock a file); on them, a collective still in flight is read again next time: the
        newest record id to read after."""
        if self.clock == HOST and any(device_ns(e) is not None for e in entries):
            self.clock, self.pairs, self.before = DEVICE, {}, {}
        if self.clock == DEVICE:
            flying = [e["record_id"] for e in entries if arrival(e) is not None and device_ns(e) is None
                      and type(e.get("record_id")) is int]
            if flying:
                return min(min(flying) - 1, newest)
        return newest

    def _pairs(self, times: Dict[Tuple[str, int], int]) -> bool:
        added = False
        for (group, k), at in sorted(times.items()):
            before = times.get((group, k - 1))
            kept = self.pairs.setdefault(group, [])
            if before is None or level(k) < self.level or (kept and kept[-1][0] >= k):
                continue
            kept.append((k, before, at))
            added = True
        for kept in self.pairs.values():
            del kept[:-KEPT]
        return added


class RankArrivals(NamedTuple):
    """A rank's file: its clock, and group -> (its size, k -> (arrived at k-1, at k), ns)."""

    clock: str
    groups: Dict[str, Tuple[int, Dict[int, Tuple[int, int]]]]


def read_arrivals(directory: str, rank: int, start: int) -> Optional[RankArrivals]:
    """A rank's file as written by start ``start`` of the ranks; None where it is not one."""
    data = read_json(arrivals_path(directory, rank))
    if not isinstance(data, dict) or data.get("start") != start or data.get("clock") not in CLOCKS:
        return None
    groups = data.get("groups")
    if not isinstance(groups, dict):
        return None
    out = {}
    for name, one in groups.items():
        pairs = one.get("pairs") if isinstance(one, dict) else None
        size = one.get("size") if isinstance(one, dict) else None
        if not (isinstance(name, str) and type(size) is int and size > 0 and isinstance(pairs, list)
                and len(pairs) <= KEPT):
            return None
        if not all(isinstance(p, list) and len(p) == 3 and all(type(v) is int and v >= 0 for v in p) for p in pairs):
            return None
        out[name] = (size, {k: (a, b) for k, a, b in pairs})
    return RankArrivals(data["clock"], out)


def watch(directory: Optional[str], rank: int) -> Optional[ArrivalWatch]:
    if not directory or rank < 0 or not os.path.isdir(directory):
        return None
    one = ArrivalWatch(directory, rank)
    one.start()
    return one

