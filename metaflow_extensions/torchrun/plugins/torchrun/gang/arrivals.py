"""Who the gang waits for: the rank that reaches the collectives last, and what that costs a step.

In a job whose every step ends in a collective, the ranks leave each collective together, so their
step rates are all the slowest rank's. When each rank *arrived* tells them apart: a rank that is
consistently the last to reach the collectives is the one the others wait for.

- a rank: procs/arrivals.py writes when it enqueued its newest collectives (the Flight Recorder's
  ``time_created_ns``, the host's wall clock);
- a node: ``ArrivalTracker`` folds its ranks' files into one ``NodeArrivals`` per heartbeat that carries
  progress: for each of the newest ``SENT`` collectives every local rank reached, the node's latest
  arrival, whose it was, and its second-latest. Constant per node: the control joins the nodes'
  records with no rank's own list;
- the control: ``ArrivalBook`` puts each node's times on its own clock (``recv - sent``, the least over
  the recent heartbeats: the clock offset plus the shortest one-way delay, well under a millisecond on
  a LAN), joins the nodes per collective into the last arrival and the latest of the others', and
  gang/arrival_cost.py turns a window of them into what the last rank costs the others per step,
  whether they wait for it at every collective or once a step (DDP's buckets). A rank whose lags make
  ``SHARE`` of all the waiting and each step ``RATIO`` times longer, for ``SUSTAIN`` seconds, past a
  start's first ``WARMUP_NS``, is named. In an even gang the ranks take turns at being last, and nobody
  is named.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Annotated, Deque, Dict, List, Optional, Tuple

from ..base.codec import Int, Items, Record
from ..procs.arrivals import read_arrivals
from .arrival_cost import Arrival, Cost, cost, pair
from .wire import ProtocolError

SENT = 48  # collectives a node's record holds, the newest its ranks all reached
MAX_US = 1 << 40  # an arrival's offset from the record's first, in microseconds
RANK_LIMIT = 1 << 31
WINDOW = 400  # the collectives a verdict looks at, the newest
MIN_SEEN = 40  # no verdict on fewer intervals
SHARE = 0.75  # a rank whose lags make this share of all the others' waiting ...
RATIO = 1.05  # ... and each step this many times longer than it would be ...
SUSTAIN = 20.0  # ... for this many seconds in a row is named (under heavy load a CPU-starved node flickered 8 s)
# A start's first collectives are not its pace: its nodes still start up side by side (a local run's other
# node's task, a data loader's workers, a first compile). Those of its first WARMUP seconds are not counted.
WARMUP_NS = 10 * 10 ** 9
OFFSET_SAMPLES = 16  # heartbeats the clock offset is the least of
SIGNAL_ARRIVAL = "arrival"

Micros = Tuple[Annotated[int, Int(0, MAX_US)], ...]


@dataclass(frozen=True)
class NodeArrivals(Record):
    """Collectives ``seq``, ``seq + 1``, ... as one node's ``ranks`` ranks reached them: for each, its latest
    arrival (``last``, µs after ``base``, the node's wall clock in ns), whose (``who``, a global rank) and the
    second-latest (``second``, µs after ``base``; ``last`` on a node of one rank); ``sent``: the node's clock
    as it sampled."""

    ERROR = ProtocolError
    base: Annotated[int, Int(0, 1 << 62)]
    sent: Annotated[int, Int(0, 1 << 62)]
    seq: Annotated[int, Int(0, 1 << 53)]
    ranks: Annotated[int, Int(1, 1 << 20)]
    last: Annotated[Micros, Items(SENT)] = ()
    who: Annotated[Tuple[Annotated[int, Int(0, RANK_LIMIT - 1)], ...], Items(SENT)] = ()
    second: Annotated[Micros, Items(SENT)] = ()

    def problem(self) -> Optional[str]:
        if not len(self.last) == len(self.who) == len(self.second):
            return "arrivals of unequal lengths"
        if any(b > a for a, b in zip(self.last, self.second)):
            return "a second-latest arrival after the latest"
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
        last, who, second = [], [], []
        for s in seqs:
            order = sorted(each, key=lambda r: (each[r][s], r))
            last.append(min(MAX_US, (each[order[-1]][s] - base) // 1000))
            who.append(order[-1])
            second.append(min(MAX_US, (each[order[-2 if len(order) > 1 else -1]][s] - base) // 1000))
        return NodeArrivals(base, self.clock_ns(), seqs[0], len(each), tuple(last), tuple(who), tuple(second))


# -- on the control -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrivalVerdict:
    """Who the others wait for, over the window: one rank, or the ranks of one node (a slow machine: its
    ranks take turns at being the last), with its share of all the waiting, the others' wait for it (ms of
    each second) and the step-time ratio it causes (``ratio``)."""

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


class Joined:
    """One collective over the gang: the rank view (the last rank against the second-latest) and the node
    view (the last node against the latest of the others); ``node`` is the last rank's."""

    __slots__ = ("seq", "rank", "node", "of_node")

    def __init__(self, seq: int, rank: Arrival, node: Optional[Arrival], of_node: int) -> None:
        self.seq, self.rank, self.node, self.of_node = seq, rank, node, of_node


def join(seq: int, times: Dict[int, Tuple[float, int, float, int]]) -> Optional[Joined]:
    """``times``: node -> (its latest arrival, whose, its second-latest, its ranks), on one clock."""
    if sum(count for _, _, _, count in times.values()) < 2:
        return None
    node = max(times, key=lambda n: (times[n][0], -n))
    last, who, second, count = times[node]
    others = [times[n][0] for n in times if n != node]
    ref = max(others + ([second] if count > 1 else []))
    by_node = Arrival(last, node, max(others)) if others else None
    return Joined(seq, Arrival(last, who, ref), by_node, node)


class ArrivalBook:
    """The control's join of the nodes' records, per start of the ranks (numbers begin again)."""

    def __init__(self, clock_ns=time.time_ns) -> None:
        self.clock_ns = clock_ns
        self.nodes: Dict[int, NodeArrivals] = {}
        self.gaps: Dict[int, Deque[int]] = {}  # node -> recent (recv - sent), ns
        self.window: Deque[Joined] = deque(maxlen=WINDOW)
        self.tallied = -1
        self.first_ns: Optional[float] = None  # the start's first collective, on the control's clock
        self.last_verdict: Tuple[object, Optional[ArrivalVerdict]] = (None, None)

    def new_start(self) -> None:
        self.nodes.clear()
        self.window.clear()
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
        times = {}
        for node, r in records.items():
            i = seq - r.seq
            shift = r.base + min(self.gaps[node])  # the node's clock on the control's
            times[node] = (shift + r.last[i] * 1000.0, r.who[i], shift + r.second[i] * 1000.0, r.ranks)
        joined = join(seq, times)
        if joined is None:
            return
        if self.first_ns is None:
            self.first_ns = joined.rank.last
        if joined.rank.last - self.first_ns >= WARMUP_NS:
            self.window.append(joined)

    def verdict(self) -> Optional[ArrivalVerdict]:
        """The rank the others wait for, or else the node, whose lags make ``SHARE`` of all their waiting and
        each step ``RATIO`` times longer, over the window; else None. Worked out again only once the window
        has changed (a heartbeat's collectives; the fit takes milliseconds)."""
        key = (self.tallied, len(self.window), self.first_ns)
        if self.last_verdict[0] != key:
            self.last_verdict = (key, self._verdict())
        return self.last_verdict[1]

    def _verdict(self) -> Optional[ArrivalVerdict]:
        steps = [(a, b) for a, b in zip(self.window, list(self.window)[1:]) if b.seq == a.seq + 1]
        if len(steps) < MIN_SEEN:
            return None
        by_rank = cost([pair(a.rank, b.rank) for a, b in steps])
        if by_rank is not None and _named(by_rank):
            node = next(b.of_node for _, b in reversed(steps) if b.rank.who == by_rank.who)
            return _verdict((by_rank.who,), node, by_rank)
        nodes = [(a.node, b.node) for a, b in steps if a.node is not None and b.node is not None]
        by_node = cost([pair(a, b) for a, b in nodes]) if len(nodes) >= MIN_SEEN else None
        if by_node is None or not _named(by_node):
            return None
        ranks = tuple(sorted({b.rank.who for _, b in steps if b.of_node == by_node.who}))
        return _verdict(ranks, by_node.who, by_node)


def _named(found: Cost) -> bool:
    return found.share >= SHARE and found.ratio >= RATIO


def _verdict(ranks: Tuple[int, ...], node: int, found: Cost) -> ArrivalVerdict:
    return ArrivalVerdict(ranks, node, round(found.share, 3), round(found.waited * 1000.0, 1), round(found.ratio, 2),
                          found.seen)
