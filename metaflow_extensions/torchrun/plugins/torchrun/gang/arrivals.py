"""Who the gang waits for: the rank that reaches the collectives last, and what that costs a step.

In a job whose every step ends in a collective, the ranks leave each collective together, so their
step rates are all the slowest rank's. When each rank *arrived* tells them apart: a rank that is
consistently the last to reach the collectives is the one the others wait for.

- a rank: procs/arrivals.py writes when it enqueued its collectives (the Flight Recorder's
  ``time_created_ns``, the host's wall clock), as pairs of successive collectives of a group, one pair in
  ``2**level`` at high rates, picked alike on every rank;
- a node: ``ArrivalTracker`` folds its ranks' files into one ``NodeArrivals`` per heartbeat that carries
  progress: for each pair it has not sent (at most ``SENT``, thinned by the same rule where more are
  waiting) and each of its two collectives, the node's latest arrival, whose it was, and its
  second-latest. Constant per node: the control joins the nodes' records with no rank's own list;
- the control: ``ArrivalBook`` puts each node's times on its own clock (``recv - sent``, the least over
  the recent heartbeats: the clock offset plus the shortest one-way delay, well under a millisecond on
  a LAN), joins a pair once the nodes that sent it hold every rank of its group, into the last arrival
  and the latest of the others', and gang/arrival_cost.py turns a window of them into what the last rank
  costs the others per step, whether they wait for it at every collective or once a step (DDP's buckets).
  A rank whose lags make ``SHARE`` of all the waiting and each step ``RATIO`` times longer, for
  ``SUSTAIN`` seconds, past a start's first ``WARMUP_NS``, is named. In an even gang the ranks take turns
  at being last, and nobody is named.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Annotated, Deque, Dict, List, Optional, Set, Tuple

from ..base.codec import Int, Items, OneOf, Record, Text
from ..base.timeouts import PROGRESS_SEND
from ..procs.arrivals import CLOCKS, HOST, KEPT, MAX_GROUPS, level, read_arrivals, settled
from .arrival_cost import Arrival, Cost, cost, pair
from .wire import ProtocolError

SENT = 48  # pairs of collectives a node's record holds: the oldest it has not sent
ROOM = 0.8  # the share of a heartbeat's pairs the rate may fill: the rest takes a rank's file's bursts
MAX_US = 1 << 40  # an arrival's offset from the record's first, in microseconds
RANK_LIMIT = 1 << 31
WINDOW = 400  # the pairs of each group a verdict looks at, the newest
PENDING = 4096  # pairs some nodes sent and others not yet (or never: they kept fewer), the newest
MIN_SEEN = 40  # no verdict on fewer pairs
SHARE = 0.75  # a rank whose lags make this share of all the others' waiting ...
RATIO = 1.05  # ... and each step this many times longer than it would be ...
SUSTAIN = 20.0  # ... for this many seconds in a row is named (under heavy load a CPU-starved node flickered 8 s)
# A start's first collectives are not its pace: its nodes still start up side by side (a local run's other
# node's task, a data loader's workers, a first compile). Those of its first WARMUP seconds are not counted.
WARMUP_NS = 10 * 10 ** 9
OFFSET_SAMPLES = 16  # heartbeats the clock offset is the least of
SIGNAL_ARRIVAL = "arrival"

Micros = Tuple[Annotated[int, Int(0, MAX_US)], ...]
Ranks = Annotated[int, Int(1, RANK_LIMIT - 1)]


@dataclass(frozen=True)
class NodeArrivals(Record):
    """Pairs of successive collectives (``seq - 1`` and ``seq`` of group ``groups[group]``) as this node's
    ranks in the group (``members`` of its ``sizes``) reached them: for the two, in turn, the node's latest
    arrival (``last``, µs after ``base``, the node's wall clock in ns), whose (``who``, a global rank) and the
    second-latest (``second``; ``last`` where the node has one member); ``sent``: the node's clock as it
    sampled; ``clock``: the ranks' (procs/arrivals.py's HOST or DEVICE). At most ``SENT`` pairs: constant
    per node, whatever the collectives' rate or the gang's size."""

    ERROR = ProtocolError
    base: Annotated[int, Int(0, 1 << 62)]
    sent: Annotated[int, Int(0, 1 << 62)]
    clock: Annotated[str, OneOf(CLOCKS)] = HOST
    groups: Annotated[Tuple[Annotated[str, Text(64)], ...], Items(MAX_GROUPS)] = ()
    sizes: Annotated[Tuple[Ranks, ...], Items(MAX_GROUPS)] = ()
    members: Annotated[Tuple[Ranks, ...], Items(MAX_GROUPS)] = ()
    group: Annotated[Tuple[Annotated[int, Int(0, MAX_GROUPS - 1)], ...], Items(SENT)] = ()
    seq: Annotated[Tuple[Annotated[int, Int(1, 1 << 53)], ...], Items(SENT)] = ()
    last: Annotated[Micros, Items(2 * SENT)] = ()
    who: Annotated[Tuple[Annotated[int, Int(0, RANK_LIMIT - 1)], ...], Items(2 * SENT)] = ()
    second: Annotated[Micros, Items(2 * SENT)] = ()

    def problem(self) -> Optional[str]:
        if not len(self.groups) == len(self.sizes) == len(self.members):
            return "groups of unequal lengths"
        if any(m > n for m, n in zip(self.members, self.sizes)):
            return "more members of a group than it has"
        if len(self.group) != len(self.seq) or not len(self.last) == len(self.who) == len(self.second) \
                == 2 * len(self.seq):
            return "arrivals of unequal lengths"
        if any(g >= len(self.groups) for g in self.group):
            return "a pair of no group"
        if any(b > a for a, b in zip(self.last, self.second)):
            return "a second-latest arrival after the latest"
        return None


# -- on each node -------------------------------------------------------------------------------------


class ArrivalTracker:
    """Per call: its ranks' files, folded for the heartbeat; the pairs sent so far, per start of the ranks."""

    def __init__(self, workdir: str, clock_ns=time.time_ns) -> None:
        self.workdir = workdir
        self.clock_ns = clock_ns
        self.start = -1
        self.sent: Dict[str, Set[int]] = {}  # group -> the pairs sent or passed over, the newest
        self.sampled: Optional[int] = None  # the last heartbeat's clock, ns
        self.above = 0  # levels above the ranks' of the pairs sent

    def sample(self, ranks: List[int], start: int) -> Optional[NodeArrivals]:
        """None until every one of ``ranks`` (of start ``start``) wrote pairs, and while none is new. Called
        only for a heartbeat that carries it: what it returns counts as sent. The oldest first, so that a
        burst (a rank writes its file every few seconds) goes out over the next heartbeats; where more
        come than the heartbeats carry (a gang whose heartbeats carry progress less often), the pairs of
        a higher level only, as every node picks them."""
        if not ranks:
            return None
        if start != self.start:
            self.start, self.sent, self.sampled, self.above = start, {}, None, 0
        reads = {rank: read_arrivals(self.workdir, rank, start) for rank in ranks}
        clocks = {read.clock if read is not None else None for read in reads.values()}
        if None in clocks or len(clocks) > 1:
            return None  # a rank not there yet, or ranks on the host's clock and the device's
        each = {rank: read.groups for rank, read in reads.items() if read is not None}
        groups: Dict[str, Tuple[int, List[int]]] = {}  # group -> (size, its members here)
        for rank in ranks:
            for name, (size, _) in each[rank].items():
                groups.setdefault(name, (size, []))[1].append(rank)
        names = sorted(groups, key=lambda g: (g != "0", g))[:MAX_GROUPS]
        new = []
        for index, name in enumerate(names):
            members, sent = groups[name][1], self.sent.setdefault(name, set())
            common = set.intersection(*(set(each[r][name][1]) for r in members))
            new += [(min(each[r][name][1][k][1] for r in members), k, index) for k in common if k not in sent]
        floor = self._floor(new)
        chosen = sorted(p for p in new if level(p[1]) >= floor)[:SENT]
        for _, k, g in [p for p in new if level(p[1]) < floor] + chosen:
            self.sent[names[g]].add(k)
        for name, sent in self.sent.items():
            if len(sent) > 4 * KEPT:
                self.sent[name] = set(sorted(sent)[-2 * KEPT:])
        clock = str(clocks.pop())
        return self._fold(each, names, groups, [(k, g) for _, k, g in chosen], clock) if chosen else None

    def _floor(self, new: List[Tuple[int, int, int]]) -> int:
        """The least level whose pairs the heartbeats keep up with: from the rate the ranks' files hold
        pairs at (their own times: alike on every node, right from the first heartbeat) and the pairs a
        heartbeat carries, kept while the rate stays near; above the level the ranks kept them at."""
        now = self.clock_ns()
        every = (now - self.sampled) / 1e9 if self.sampled is not None and now > self.sampled else PROGRESS_SEND
        self.sampled = now
        times = sorted(t for t, _, _ in new)
        if len(times) > 1 and times[-1] - times[0] >= 10 ** 9:
            self.above = settled(self.above, (len(times) - 1) / ((times[-1] - times[0]) / 1e9), ROOM * SENT / every)
        return min((level(k) for _, k, _ in new), default=0) + self.above

    def _fold(self, each: Dict[int, Dict[str, Tuple[int, Dict[int, Tuple[int, int]]]]], names: List[str],
              groups: Dict[str, Tuple[int, List[int]]], chosen: List[Tuple[int, int]], clock: str) -> NodeArrivals:
        times = [[each[r][names[g]][1][k] for r in groups[names[g]][1]] for k, g in chosen]
        base = min(min(min(t) for t in pairs) for pairs in times)
        last: List[int] = []
        who: List[int] = []
        second: List[int] = []
        for (_, g), arrived in zip(chosen, times):
            members = groups[names[g]][1]
            for side in (0, 1):
                order = sorted(range(len(members)), key=lambda i: (arrived[i][side], members[i]))
                last.append(min(MAX_US, (arrived[order[-1]][side] - base) // 1000))
                who.append(members[order[-1]])
                second.append(min(MAX_US, (arrived[order[-2 if len(order) > 1 else -1]][side] - base) // 1000))
        return NodeArrivals(base, self.clock_ns(), clock, tuple(names), tuple(groups[n][0] for n in names),
                            tuple(len(groups[n][1]) for n in names), tuple(g for _, g in chosen),
                            tuple(k for k, _ in chosen), tuple(last), tuple(who), tuple(second))


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
    view (the last node against the latest of the others; None on one node); ``of_node``: the last rank's."""

    __slots__ = ("rank", "node", "of_node")

    def __init__(self, rank: Arrival, node: Optional[Arrival], of_node: int) -> None:
        self.rank, self.node, self.of_node = rank, node, of_node


Seen = Tuple[float, int, float, int]  # a node's latest arrival, whose, its second-latest, its members


def join(times: Dict[int, Seen]) -> Optional[Joined]:
    """``times``: node -> what it saw of one collective, on one clock."""
    if sum(count for _, _, _, count in times.values()) < 2:
        return None
    node = max(times, key=lambda n: (times[n][0], -n))
    last, who, second, count = times[node]
    others = [times[n][0] for n in times if n != node]
    ref = max(others + ([second] if count > 1 else []))
    by_node = Arrival(last, node, max(others)) if others else None
    return Joined(Arrival(last, who, ref), by_node, node)


class ArrivalBook:
    """The control's join of the nodes' records, per start of the ranks (numbers begin again): a pair is
    joined once the nodes that sent it hold every rank of its group."""

    def __init__(self, clock_ns=time.time_ns) -> None:
        self.clock_ns = clock_ns
        self.gaps: Dict[int, Deque[int]] = {}  # node -> recent (recv - sent), ns
        self.pending: "OrderedDict[Tuple[str, int], Dict[int, Tuple[Seen, Seen]]]" = OrderedDict()
        self.held: Dict[Tuple[str, int], int] = {}  # the ranks a pending pair has been heard from
        self.sizes: Dict[str, int] = {}
        self.window: Dict[str, Deque[Tuple[Joined, Joined]]] = {}
        self.joined = 0  # pairs joined this start: the verdict is worked out again when it grows
        self.first_ns: Optional[float] = None  # the start's first pair, on the control's clock
        self.clock: Optional[str] = None  # the start's arrivals': the host's or the device's
        self.last_verdict: Tuple[object, Optional[ArrivalVerdict]] = (None, None)

    def new_start(self) -> None:
        self.pending.clear()
        self.held.clear()
        self.window.clear()
        self.joined = 0
        self.first_ns = None
        self.clock = None

    def update(self, node: int, arrivals: Optional[NodeArrivals]) -> None:
        if arrivals is None or arrivals.clock != (self.clock or arrivals.clock):
            return  # a start's arrivals are on one clock: the first node's (a gang mixing them compares none)
        self.clock = arrivals.clock
        gaps = self.gaps.setdefault(node, deque(maxlen=OFFSET_SAMPLES))
        gaps.append(self.clock_ns() - arrivals.sent)
        shift = arrivals.base + min(gaps)  # the node's clock on the control's
        for i, (g, k) in enumerate(zip(arrivals.group, arrivals.seq)):
            name, members = arrivals.groups[g], arrivals.members[g]
            self.sizes[name] = arrivals.sizes[g]
            sides = tuple((shift + arrivals.last[j] * 1000.0, arrivals.who[j], shift + arrivals.second[j] * 1000.0,
                           members) for j in (2 * i, 2 * i + 1))
            self._add((name, k), node, (sides[0], sides[1]))

    def _add(self, key: Tuple[str, int], node: int, sides: Tuple[Seen, Seen]) -> None:
        nodes = self.pending.setdefault(key, {})
        had = nodes.get(node)
        nodes[node] = sides
        held = self.held.get(key, 0) + sides[0][3] - (had[0][3] if had else 0)  # the ranks heard from
        if held < self.sizes[key[0]]:
            self.held[key] = held
            while len(self.pending) > PENDING:
                self.held.pop(self.pending.popitem(last=False)[0], None)
            return
        del self.pending[key]
        self.held.pop(key, None)
        before, after = join({n: s[0] for n, s in nodes.items()}), join({n: s[1] for n, s in nodes.items()})
        if before is None or after is None:
            return
        if self.first_ns is None:
            self.first_ns = after.rank.last
        if after.rank.last - self.first_ns >= WARMUP_NS:
            self.window.setdefault(key[0], deque(maxlen=WINDOW)).append((before, after))
            self.joined += 1

    def verdict(self) -> Optional[ArrivalVerdict]:
        """The rank the others wait for, or else the node, whose lags make ``SHARE`` of all their waiting and
        each step ``RATIO`` times longer, over the window of a group; else None. Worked out again only once
        the window has changed (a heartbeat's pairs; the fit takes milliseconds)."""
        key = (self.joined, self.first_ns)
        if self.last_verdict[0] != key:
            self.last_verdict = (key, _among([v for v in map(_group_verdict, self.window.values()) if v is not None]))
        return self.last_verdict[1]


def _among(verdicts: List[ArrivalVerdict]) -> Optional[ArrivalVerdict]:
    """The costliest group's; where it names a node's ranks and another group names one of them alone (the
    data-parallel group waits for a tensor-parallel pair, that pair for one of its ranks), that rank."""
    if not verdicts:
        return None
    worst = max(verdicts, key=lambda v: v.ratio)
    alone = [v for v in verdicts if len(v.ranks) == 1 and v.ranks[0] in worst.ranks]
    if len(worst.ranks) > 1 and alone:
        return dataclasses.replace(worst, ranks=max(alone, key=lambda v: v.ratio).ranks)
    return worst


def _group_verdict(window: Deque[Tuple[Joined, Joined]]) -> Optional[ArrivalVerdict]:
    if len(window) < MIN_SEEN:
        return None
    by_rank = cost([pair(a.rank, b.rank) for a, b in window])
    if by_rank is not None and _named(by_rank):
        node = next(b.of_node for _, b in reversed(window) if b.rank.who == by_rank.who)
        return _verdict((by_rank.who,), node, by_rank)
    nodes = [(a.node, b.node) for a, b in window if a.node is not None and b.node is not None]
    by_node = cost([pair(a, b) for a, b in nodes]) if len(nodes) >= MIN_SEEN else None
    if by_node is None or not _named(by_node):
        return None
    ranks = tuple(sorted({b.rank.who for _, b in window if b.of_node == by_node.who}))
    return _verdict(ranks, by_node.who, by_node)


def _named(found: Cost) -> bool:
    return found.share >= SHARE and found.ratio >= RATIO


def _verdict(ranks: Tuple[int, ...], node: int, found: Cost) -> ArrivalVerdict:
    return ArrivalVerdict(ranks, node, round(found.share, 3), round(found.waited * 1000.0, 1), round(found.ratio, 2),
                          found.seen)
