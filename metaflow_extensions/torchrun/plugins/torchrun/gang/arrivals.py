"""Who the gang waits for: the rank that reaches the collectives last.

In a job whose every step ends in a collective, the ranks leave each collective together, so their
step rates are all the slowest rank's. When each rank *arrived* tells them apart: a rank that is
consistently the last to enqueue a collective is the one the others wait for.

- a rank: procs/arrivals.py writes when it enqueued its newest collectives (the Flight Recorder's
  ``time_created_ns``, the host's wall clock);
- a node: ``ArrivalTracker`` folds its ranks' files into one ``NodeArrivals`` per heartbeat that carries
  progress: for each of the newest ``SENT`` collectives every local rank reached, the node's latest
  arrival, whose it was, and the sum of its ranks' arrivals. Constant per node: the control joins the
  nodes' records with no rank's own list;
- the control: ``ArrivalBook`` puts each node's times on its own clock (``recv - sent``, the least over
  the recent heartbeats: the clock offset plus the shortest one-way delay, well under a millisecond on
  a LAN), joins the nodes per collective, and names a rank that arrives last at ``SHARE`` of the recent
  collectives while the others lose at least ``RATIO`` of their time waiting for it, for ``SUSTAIN``
  seconds, past a start's first ``WARMUP_NS``. In an even gang the ranks take turns at being last, and
  nobody is named.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Annotated, Deque, Dict, List, Optional, Tuple

from ..base.codec import Int, Items, Record
from ..procs.arrivals import read_arrivals
from .wire import ProtocolError

SENT = 48  # collectives a node's record holds, the newest its ranks all reached
MAX_US = 1 << 40  # an arrival's offset from the record's first, in microseconds
RANK_LIMIT = 1 << 31
WINDOW = 200  # the collectives a verdict looks at, the newest
MIN_SEEN = 30  # no verdict on fewer
MATERIAL_US = 1000  # a wait this long or longer (and RATIO - 1 of a collective's time) is one spent on the late rank
SHARE = 0.75  # a rank last at this share of the collectives where the others waited ...
RATIO = 1.05  # ... whose wait costs the others this much of their time ...
SUSTAIN = 20.0  # ... for this many seconds in a row is named (under heavy load a CPU-starved node flickered 8 s)
# A start's first collectives are not its pace: its nodes still start up side by side (a local run's other
# node's task, a data loader's workers, a first compile). Those of its first WARMUP seconds are not counted.
WARMUP_NS = 10 * 10 ** 9
OFFSET_SAMPLES = 16  # heartbeats the clock offset is the least of
SIGNAL_ARRIVAL = "arrival"

Micros = Tuple[Annotated[int, Int(0, MAX_US)], ...]


@dataclass(frozen=True)
class NodeArrivals(Record):
    """Collectives ``seq``, ``seq + 1``, ... as one node's ranks reached them: for each, its latest arrival
    (``last``, µs after ``base``, the node's wall clock in ns), whose (``who``, a global rank) and the sum of
    its ``ranks`` ranks' arrivals (``total``, µs after ``base``); ``sent``: the node's clock as it sampled."""

    ERROR = ProtocolError
    base: Annotated[int, Int(0, 1 << 62)]
    sent: Annotated[int, Int(0, 1 << 62)]
    seq: Annotated[int, Int(0, 1 << 53)]
    ranks: Annotated[int, Int(1, 1 << 20)]
    last: Annotated[Micros, Items(SENT)] = ()
    who: Annotated[Tuple[Annotated[int, Int(0, RANK_LIMIT - 1)], ...], Items(SENT)] = ()
    total: Annotated[Tuple[Annotated[int, Int(0, 1 << 62)], ...], Items(SENT)] = ()

    def problem(self) -> Optional[str]:
        if not len(self.last) == len(self.who) == len(self.total):
            return "arrivals of unequal lengths"
        return None


# -- on each node -------------------------------------------------------------------------------------


class ArrivalTracker:
    """Per call: its ranks' files, folded for the heartbeat."""

    def __init__(self, workdir: str, clock_ns=time.time_ns) -> None:
        self.workdir = workdir
        self.clock_ns = clock_ns

    def sample(self, ranks: List[int], start: int) -> Optional[NodeArrivals]:
        """None until every one of ``ranks`` (of start ``start``) wrote collectives they all reached."""
        if not ranks:
            return None
        each: Dict[int, Dict[int, int]] = {}
        for rank in ranks:
            read = read_arrivals(self.workdir, rank, start)
            if read is None:
                return None
            each[rank] = read
        common = set.intersection(*(set(times) for times in each.values()))
        if not common:
            return None
        first, newest = max(min(common), max(common) - SENT + 1), max(common)
        seqs = [s for s in range(first, newest + 1) if s in common]
        if len(seqs) != newest - first + 1:
            seqs = seqs[seqs.index(max(s for s in seqs if s - 1 not in common)):]  # a run without gaps
        base = min(each[r][s] for r in each for s in seqs)
        last, who, total = [], [], []
        for s in seqs:
            at = {r: each[r][s] for r in each}
            late = max(at, key=lambda r: (at[r], r))
            last.append(min(MAX_US, (at[late] - base) // 1000))
            who.append(late)
            total.append(sum(min(MAX_US, (t - base) // 1000) for t in at.values()))
        return NodeArrivals(base, self.clock_ns(), seqs[0], len(each), tuple(last), tuple(who), tuple(total))


# -- on the control -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrivalVerdict:
    """Who the others wait for, over the window: one rank, or the ranks of one node (a slow machine: its
    ranks take turns at being the last), with its share of the last arrivals where the others waited, their
    mean wait for it (ms) and how much longer each collective took for it (``ratio``)."""

    ranks: Tuple[int, ...]
    node: int
    share: float
    wait_ms: float
    ratio: float
    seen: int

    @property
    def named(self) -> str:
        """"3", or "2-3" for a node's run of ranks, or "2,5"."""
        lo, hi = self.ranks[0], self.ranks[-1]
        if len(self.ranks) > 1 and hi - lo + 1 == len(self.ranks):
            return "%d-%d" % (lo, hi)
        return ",".join(map(str, self.ranks))


class ArrivalBook:
    """The control's join of the nodes' records, per start of the ranks (numbers begin again)."""

    def __init__(self, clock_ns=time.time_ns) -> None:
        self.clock_ns = clock_ns
        self.nodes: Dict[int, NodeArrivals] = {}
        self.gaps: Dict[int, Deque[int]] = {}  # node -> recent (recv - sent), ns
        self.window: Deque[Tuple[int, int, int, float]] = deque(maxlen=WINDOW)  # (seq, rank, node, at ns)
        self.waits: Deque[float] = deque(maxlen=WINDOW)  # µs the others waited at each, for its last
        self.tallied = -1
        self.first_ns: Optional[float] = None  # the start's first collective, on the control's clock

    def new_start(self) -> None:
        self.nodes.clear()
        self.window.clear()
        self.waits.clear()
        self.tallied = -1
        self.first_ns = None

    def update(self, node: int, arrivals: Optional[NodeArrivals]) -> None:
        if arrivals is None:
            return
        gaps = self.gaps.setdefault(node, deque(maxlen=OFFSET_SAMPLES))
        gaps.append(self.clock_ns() - arrivals.sent)
        self.nodes[node] = arrivals

    def tally(self, expected: List[int]) -> None:
        """The collectives every one of ``expected`` (the nodes training now) reported, once each."""
        if not expected or any(n not in self.nodes for n in expected):
            return
        records = {n: self.nodes[n] for n in expected}
        lo = max(max(r.seq for r in records.values()), self.tallied + 1)
        hi = min(r.seq + len(r.last) - 1 for r in records.values())
        for seq in range(lo, hi + 1):
            self._one(seq, records)
        self.tallied = max(self.tallied, hi)

    def _one(self, seq: int, records: Dict[int, NodeArrivals]) -> None:
        late: Optional[Tuple[float, int, int]] = None
        total, count = 0.0, 0
        for node, r in records.items():
            i = seq - r.seq
            shift = r.base + min(self.gaps[node])  # the node's clock on the control's
            at = shift + r.last[i] * 1000.0
            if late is None or at > late[0]:
                late = (at, r.who[i], node)
            total += r.ranks * shift + r.total[i] * 1000.0
            count += r.ranks
        if late is None or count < 2:
            return
        if self.first_ns is None:
            self.first_ns = late[0]
        if late[0] - self.first_ns < WARMUP_NS:
            return
        others = (total - late[0]) / (count - 1)
        self.window.append((seq, late[1], late[2], late[0]))
        self.waits.append(max(0.0, (late[0] - others) / 1000.0))

    def verdict(self) -> Optional[ArrivalVerdict]:
        """The rank the others waited for most, or else the node, where it was last at ``SHARE`` or more of the
        collectives at which they waited (long enough to count) and that wait costs them ``RATIO``; else None."""
        if len(self.window) < MIN_SEEN:
            return None
        by_rank = [(rank, wait) for (_, rank, _, _), wait in zip(self.window, self.waits)]
        by_node = [(node, wait) for (_, _, node, _), wait in zip(self.window, self.waits)]
        for key, pairs in ((0, by_rank), (1, by_node)):
            found = self._culprit(pairs)
            if found is None:
                continue
            who, share, mean_wait, ratio = found
            entries = [e for e in self.window if e[1 + key] == who]
            node = entries[-1][2]
            ranks = tuple(sorted({e[1] for e in entries}))
            return ArrivalVerdict(ranks, node, round(share, 3), round(mean_wait / 1000.0, 1), round(ratio, 2),
                                  len(self.window))
        return None

    def _culprit(self, pairs: List[Tuple[int, float]]) -> Optional[Tuple[int, float, float, float]]:
        """(who, share, mean wait µs, ratio) for the one that caused the most waiting, if it is named."""
        first, last = self.window[0], self.window[-1]
        span = (last[3] - first[3]) / 1000.0 / max(1, last[0] - first[0])  # µs a collective takes, on the mean
        # A wait that counts: one that alone would make a collective take RATIO of its time (jitter does not).
        material = max(MATERIAL_US, (RATIO - 1.0) * span)
        caused: Dict[int, float] = {}
        waited: Dict[int, int] = {}
        for who, wait in pairs:
            caused[who] = caused.get(who, 0.0) + wait
            if wait >= material:
                waited[who] = waited.get(who, 0) + 1
        counted = sum(waited.values())
        who = max(caused, key=lambda w: (caused[w], -w))
        if counted < MIN_SEEN // 2 or who not in waited:
            return None
        share = waited[who] / counted
        lost = caused[who] / len(self.window)  # µs of each collective the others spend waiting for it
        ratio = span / (span - lost) if span > lost > 0 else 0.0
        if share < SHARE or ratio < RATIO:
            return None
        return who, share, caused[who] / waited[who], ratio
