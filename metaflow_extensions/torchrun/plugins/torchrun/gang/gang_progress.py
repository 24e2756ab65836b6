"""Training progress, from a rank's report to the card: the feature's entry, and the gang's part of it.

The path of a report, and where each part lives:

- a rank: ``report(step, total, **metrics)`` (procs/rank_progress.py; users import it as
  ``metaflow_extensions.torchrun.progress``) keeps the latest in memory and writes it to the rank's
  progress file at most once a second, stamped with the rank's clock and its start of the ranks;
  procs/trainer_hooks.py reports for HF's and Lightning's ``Trainer`` with no code;
- a node: ``ProgressTracker`` (here) sums up its ranks' files into one bounded ``NodeProgress``,
  which one heartbeat in ``PROGRESS_SEND`` s carries, and one more as the ranks end (gang/client.py;
  runtime/call.py starts a tracker with each start of the ranks);
- the control: ``ProgressBook`` (here) sums up every node once a second, names each straggler once
  and says the line (gang/speaker.py says it); ``ProgressRecord`` is what the record
  (``result.progress``) and the card (card/progress.py) show.

A rate belongs to one start of the ranks: a restart or a swap starts every rank's and every node's
rates again, and no node is named slowest or a straggler until the new start has a window of its own.
The signals (steps/s, else GPU utilisation, else CPU) and why each works: docs/seeing-the-gang.md.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Deque, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from ..base.codec import LOCAL, SKIP, Int, Real, Record, Via, Written
from ..procs.rank_progress import MAX_METRICS, ProgressReport, clean_metrics, read_progress
from ..procs.status import RankStatus, read_statuses
from .arrivals import SIGNAL_ARRIVAL, SUSTAIN, ArrivalBook, ArrivalTracker, NodeArrivals
from .wire import ProtocolError

STEP_LIMIT = 1 << 53
RANK_LIMIT = 1 << 31
START_LIMIT = 1 << 16  # the gang's restarts (gang/messages.py's MAX_RESTART), torch's own beside them
MAX_RATE = 1e9
MAX_SECONDS = 1e9
# Steps per second over this many seconds of reports (two a second apart jump with every step).
RATE_WINDOW = 30.0
RATE_SAMPLES = 64

CHART_GROUPS = 32
CHART_SAMPLES = 90
MAX_STRAGGLERS = 16
RATIO_CAP = 99.0
SIGNAL_PROGRESS = "progress reports (steps/s of each node's slowest rank)"
SIGNAL_GPU = "GPU utilisation of each node (nvidia-smi; no rank reports progress)"
SIGNAL_CPU = "CPU time of each node's ranks (no rank reports progress)"
GPU_IDLE = 5.0  # below this median utilisation (%) the GPUs are idle gang-wide
# The slowest node is named only at or below this fraction of the median's steps/s:
# in an even gang some node is always the slowest.
SLOWEST_NAMED = 0.9
# The line's words while the steps/s of a start are not known yet (its ranks reported under a second of steps).
MEASURING = "ETA and steps/s measuring..."


# -- on each node: its ranks summed up for the heartbeat ----------------------------------------------


Steps = Annotated[int, Int(0, STEP_LIMIT - 1)]
Rank = Annotated[Optional[int], Int(0, RANK_LIMIT - 1)]
Rate = Annotated[Optional[float], Real(0.0, MAX_RATE, digits=4)]


def _metrics(value: Any) -> Dict[str, float]:
    """The same rule as a rank's own report (``procs/rank_progress.py``), refused where it differs."""
    if not isinstance(value, Mapping) or len(value) > MAX_METRICS or clean_metrics(value) != value:
        raise ValueError("not at most %d named finite numbers" % MAX_METRICS)
    return dict(value)


@dataclass(frozen=True)
class NodeProgress(Record):
    """``rate_min`` (its slowest rank's steps/s) sets the node's pace; ``stalled``: seconds since any rank
    advanced, on its node's clock (``hang_timeout`` reads it); ``cpu`` (per rank), ``gpu`` (mean %): fallbacks;
    ``start``: the start of the ranks it sums up (the control leaves a replaced start's aside)."""

    ERROR = ProtocolError
    DROP_NONE = True
    ranks: Annotated[int, Int(0, RANK_LIMIT - 1)] = 0  # ranks with a report
    step_min: Steps = 0
    step_median: Steps = 0
    step_max: Steps = 0
    total: Annotated[Optional[int], Int(0, STEP_LIMIT - 1)] = None
    rate: Rate = None  # steps/s of the median rank
    rate_min: Rate = None  # steps/s of the slowest rank
    slowest_rank: Rank = None
    rank_lo: Rank = None  # the node's ranks, lowest and highest (torchrun numbers them in a row)
    rank_hi: Rank = None
    stalled: Annotated[Optional[float], Real(0.0, MAX_SECONDS, digits=4)] = None
    cpu: Annotated[Optional[float], Real(0.0, 1e6, digits=4)] = None
    gpu: Annotated[Optional[float], Real(0.0, 100.0, digits=4)] = None
    metrics: Annotated[Dict[str, float], Via(_metrics, lambda m: {k: float("%.6g" % v) for k, v in m.items()}
                                             or None)] = field(default_factory=dict)
    start: Annotated[int, Int(0, START_LIMIT), SKIP] = 0
    arrivals: Annotated[Optional[NodeArrivals], SKIP] = None  # when its ranks reached their collectives

    @property
    def reporting(self) -> bool:
        return self.ranks > 0

    def problem(self) -> Optional[str]:
        if not self.step_min <= self.step_median <= self.step_max:
            return "field 'progress': steps not in order (min <= median <= max)"
        return None


@dataclass
class RankPace:
    """One rank's (report time, step) since its start of the ranks began."""

    start: int
    seen: Deque[Tuple[float, int]] = field(default_factory=lambda: deque(maxlen=RATE_SAMPLES))

    def follows(self, one: ProgressReport) -> bool:
        """False where ``one`` begins again: another start, or a step gone back (the script resumed)."""
        return one.start == self.start and (not self.seen or one.step >= self.seen[-1][1])

    def rate(self, one: ProgressReport) -> Optional[float]:
        if not self.seen or self.seen[-1] != (one.time, one.step):
            self.seen.append((one.time, one.step))
        return steps_per_second(self.seen)


def steps_per_second(seen: Deque[Tuple[float, int]], window: float = RATE_WINDOW) -> Optional[float]:
    """Over the last ``window`` seconds of reports; None before a second of them."""
    while len(seen) > 2 and seen[-1][0] - seen[0][0] > window:
        seen.popleft()
    (t0, s0), (t1, s1) = seen[0], seen[-1]
    return max(0.0, (s1 - s0) / (t1 - t0)) if t1 - t0 >= 1.0 else None


def latest_start(known: int, statuses: Iterable[RankStatus], reports: Iterable[ProgressReport]) -> int:
    """The newest start of the ranks the work directory shows: the replaced ranks' files stay until
    the new ranks' replace them."""
    return max([known] + [s.restart for s in statuses] + [r.start for r in reports])


class ProgressTracker:
    """Per call (a new call is a new work directory)."""

    def __init__(self, workdir: str, clock: Callable[[], float] = time.monotonic,
                 gpu: Callable[[], Optional[float]] = lambda: None) -> None:
        self.workdir = workdir
        self.clock = clock
        self.gpu = gpu
        self.start = 0  # the newest start of the ranks seen
        self.paces: Dict[int, RankPace] = {}
        self.last_steps: Dict[int, Tuple[int, int]] = {}  # rank -> (start, step)
        self.advanced_at: Optional[float] = None
        self.cpu_seen: Optional[Tuple[float, float, int]] = None  # (clock, CPU seconds, ranks)
        self.arrivals = ArrivalTracker(workdir)

    def sample(self) -> Optional[NodeProgress]:
        """None while no rank reports and no CPU time or GPU utilisation is known."""
        now = self.clock()
        statuses = read_statuses(self.workdir)
        found = read_progress(self.workdir)
        self.start = latest_start(self.start, statuses.values(), found.values())
        reports = {r: one for r, one in found.items() if one.start == self.start}
        cpu, gpu = self._cpu(now, [s for s in statuses.values() if s.restart == self.start]), self.gpu()
        arrivals = self.arrivals.sample(sorted(r for r, s in statuses.items() if s.restart == self.start), self.start)
        if not reports:
            known = cpu is not None or gpu is not None or arrivals is not None
            return NodeProgress(cpu=cpu, gpu=gpu, start=self.start, arrivals=arrivals) if known else None
        steps_now = {r: (one.start, one.step) for r, one in reports.items()}
        if any(self.last_steps.get(r) != s for r, s in steps_now.items()) or self.advanced_at is None:
            self.advanced_at = now
        self.last_steps = steps_now
        rates = {r: rate for r, rate in ((r, self._rate(one)) for r, one in reports.items()) if rate is not None}
        steps = sorted(one.step for one in reports.values())
        slowest = min(rates, key=lambda r: (rates[r], r)) if rates else min(reports, key=lambda r: reports[r].step)
        totals = [one.total for one in reports.values() if one.total]
        return NodeProgress(
            ranks=len(reports), step_min=steps[0], step_median=steps[(len(steps) - 1) // 2], step_max=steps[-1],
            total=max(totals) if totals else None,
            rate=statistics.median(rates.values()) if rates else None,
            rate_min=rates[slowest] if rates else None, slowest_rank=slowest,
            rank_lo=min(reports), rank_hi=max(reports), stalled=max(0.0, now - self.advanced_at), cpu=cpu, gpu=gpu,
            metrics=mean_metrics(reports[r].metrics for r in sorted(reports)), start=self.start, arrivals=arrivals)

    def _rate(self, one: ProgressReport) -> Optional[float]:
        pace = self.paces.get(one.rank)
        if pace is None or not pace.follows(one):
            pace = self.paces[one.rank] = RankPace(one.start)
        return pace.rate(one)

    def _cpu(self, now: float, statuses: List[RankStatus]) -> Optional[float]:
        pids = [s.pid for s in statuses if s.pid > 0 and s.end is None]
        used = sum(cpu_seconds(pid) for pid in pids)
        before, self.cpu_seen = self.cpu_seen, (now, used, len(pids))
        if before is None or not pids or now - before[0] < 0.5 or used < before[1]:
            return None
        return round((used - before[1]) / (now - before[0]) / len(pids), 4)


def mean_metrics(each: Iterable[Mapping[str, float]]) -> Dict[str, float]:
    """Over the ranks that report each, in the order first seen."""
    sums: Dict[str, Tuple[float, int]] = {}
    for metrics in each:
        for name, value in metrics.items():
            if name in sums or len(sums) < MAX_METRICS:
                total, count = sums.get(name, (0.0, 0))
                sums[name] = (total + value, count + 1)
    return {name: total / count for name, (total, count) in sums.items() if math.isfinite(total / count)}


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


# -- on the control: the gang summed up, its line, its stragglers, its record ---------------------------


@dataclass(frozen=True)
class Straggler(Written):
    DROP_NONE = True  # the arrival signal's own fields are left off the others
    node_index: int
    host: str
    ranks: str  # "136-143"
    ratio: Annotated[float, Real(digits=2)]
    seconds: Annotated[float, Real(digits=1)]
    signal: str
    # signal "arrival": its share of all the others' waiting, and their wait for it in ms of each second
    share: Annotated[Optional[float], Real(digits=3)] = None
    wait_ms: Annotated[Optional[float], Real(digits=1)] = None
    since: Annotated[Optional[float], Real(digits=3)] = None  # wall clock: when it began (the card's mark)

    @property
    def _many(self) -> bool:
        return any(c in self.ranks for c in ",-")

    def sentence(self) -> str:
        if self.signal == SIGNAL_ARRIVAL:
            return ("rank%s %s (node %d, %s) %s the one%s the others wait for at the collectives: %.0f %% of their "
                    "waiting, %.0f ms of every second; each step takes %.2fx the time it would without %s (for %s)" % (
                        "s" if self._many else "", self.ranks, self.node_index, self.host,
                        "are" if self._many else "is", "s" if self._many else "", 100 * (self.share or 0.0),
                        self.wait_ms or 0.0, self.ratio, "them" if self._many else "it", duration(self.seconds)))
        what = {SIGNAL_PROGRESS: "slower than the median",
                SIGNAL_GPU: "less busy on GPU than the median (its GPUs wait for its input or CPU)"}.get(
            self.signal, "busier on CPU than the median (the others wait for it)")
        return "node %d (%s, ranks %s) is %.1fx %s for %s" % (
            self.node_index, self.host, self.ranks or "?", self.ratio, what, duration(self.seconds))


@dataclass(frozen=True)
class ProgressRecord(Written):
    """At the end of a call, or now (the live card; the chart is not in the record)."""

    step: Optional[int] = None
    total: Optional[int] = None
    percent: Optional[float] = None
    eta_seconds: Optional[float] = None
    steps_per_second: Optional[float] = None
    metrics: Dict[str, float] = field(default_factory=dict)
    nodes_reporting: int = 0
    signal: Optional[str] = None
    # node_index, host, ranks, ratio (to the median); only a node at SLOWEST_NAMED or less
    slowest: Optional[Dict[str, Any]] = None
    stragglers: Tuple[Straggler, ...] = ()
    stragglers_more: int = 0
    # Ranks report steps but their steps/s are not known yet (under a second of a start's reports: a call's
    # first, or a restart's): the line and the card say the steps/s and the ETA are being measured.
    measuring: Annotated[bool, LOCAL] = False
    # For the card: seconds since the call's first report, and steps/s per group of nodes.
    chart_groups: Annotated[Tuple[str, ...], LOCAL] = ()
    chart: Annotated[Tuple[Tuple[float, Tuple[Optional[float], ...]], ...], LOCAL] = ()


class ProgressBook:
    """``window``: seconds a node must be slow, in one start of the ranks, to be named a straggler. After a
    restart or a swap the slowest node is named once the new start has reported for ``settle`` (the window,
    at most ``RATE_WINDOW``): its first rates are a second or two of steps, some nodes' not yet in."""

    def __init__(self, num_nodes: int, ratio: float, window: float) -> None:
        self.num_nodes = num_nodes
        self.ratio = ratio
        self.window = window
        self.settle = min(window, RATE_WINDOW)
        self.nodes: Dict[int, Tuple[NodeProgress, str]] = {}
        self.started: Optional[float] = None
        self.start = 0  # the start of the ranks summed up: the newest a node reported from
        self.start_seen: Optional[float] = None  # when the book first summed it up
        self.settled = False
        # The call's ranks have reported progress: its steps are the signal, and a gap in the reports (a
        # restart's new ranks starting) is nothing to compare, not a call for the CPU's or the GPU's.
        self.reported = False
        self.slow_since: Dict[int, float] = {}
        self.named: Dict[int, Straggler] = {}
        self.unlisted: Set[int] = set()
        self.chart: List[Tuple[float, Tuple[Optional[float], ...]]] = []
        self.chart_every = 5.0
        self.next_sample = 0.0
        self.summary = ProgressRecord()
        self.arrivals = ArrivalBook()
        self.late_since: Optional[Tuple[int, float]] = None  # (node, since): its rank(s) last to arrive, by enough
        self.late: Optional[Straggler] = None  # that rank now, however long (None: nobody now)

    def new_call(self) -> None:
        """Stragglers named stay named."""
        self._new_start(0)
        self.reported = False
        self.chart = []
        self.started = None
        self.chart_every = 5.0

    def restarted(self, start: int) -> None:
        """The gang decided restart ``start`` of the call's ranks (a restart in place, a swap, a loss): what the
        replaced ranks reported is not said after it (the control's last sum of it lags their step by up to a
        heartbeat, so a line of it would read as training gone back), and nothing is said before the new
        ranks report."""
        if start > self.start:
            self._new_start(start)

    def update(self, node: int, host: str, progress: Optional[NodeProgress]) -> None:
        if progress is None:
            self.nodes.pop(node, None)
            return
        if progress.start < self.start:
            return  # the replaced ranks', sent before the node heard of the restart
        if progress.start > self.start:
            self._new_start(progress.start)
        self.nodes[node] = (progress, host)
        self.arrivals.update(node, progress.arrivals)

    def _new_start(self, start: int) -> None:
        """A restart or a swap: the rates start again, and so does each node's time as slow."""
        self.start = start
        self.nodes.clear()
        self.slow_since.clear()
        self.arrivals.new_start()
        self.late_since, self.late = None, None
        self.start_seen, self.settled = None, False
        self.summary = ProgressRecord(stragglers=self.summary.stragglers, stragglers_more=len(self.unlisted))

    def current(self) -> ProgressRecord:
        """Summed up now: a call's last heartbeats come after its last check."""
        if not self.nodes:
            return self.summary
        return self._summary({n: ph for n, ph in self.nodes.items() if ph[0].reporting})

    @property
    def reporting(self) -> bool:
        return any(p.reporting for p, _ in self.nodes.values())

    def check(self, now: float) -> List[Straggler]:
        """The stragglers named just now."""
        if not self.nodes:
            return []
        if self.started is None:
            self.started = now
        if self.start_seen is None:
            self.start_seen = now
        self.settled = self.start == 0 or now - self.start_seen >= self.settle
        reporting = {n: ph for n, ph in self.nodes.items() if ph[0].reporting}
        self.reported = self.reported or bool(reporting)
        named = self._stragglers(now, reporting) + self._late(now)
        if reporting and now >= self.next_sample:
            self._sample(now - self.started, reporting)
            self.next_sample = now + self.chart_every
        self.summary = self._summary(reporting)
        return named

    def _stragglers(self, now: float, reporting: Dict[int, Tuple[NodeProgress, str]]) -> List[Straggler]:
        ratios, signal = self._ratios(reporting)
        for node in [n for n in self.slow_since if ratios.get(n, 0.0) < self.ratio]:
            del self.slow_since[node]
        named = []
        for node, ratio in ratios.items():
            since = self.slow_since.setdefault(node, now)
            progress, host = self.nodes[node]
            one = Straggler(node, host, _ranks(progress), ratio, now - since, signal)
            if node in self.named:
                self.named[node] = one  # how long it has been slow, kept up to date
            elif now - since >= self.window and node not in self.unlisted:
                if len(self.named) < MAX_STRAGGLERS:
                    self.named[node] = one
                else:
                    self.unlisted.add(node)  # named in the log, counted in the record
                named.append(one)
        return named

    def _late(self, now: float) -> List[Straggler]:
        """The rank the others wait for at the collectives (gang/arrivals.py), named once it has been so
        for ``SUSTAIN`` seconds; none where its node is named already."""
        verdict = self.arrivals.verdict()
        if verdict is None or verdict.node not in self.nodes:
            self.late_since, self.late = None, None
            return []
        if self.late_since is None or self.late_since[0] != verdict.node:
            self.late_since = (verdict.node, now)
        since = self.late_since[1]
        one = self.late = Straggler(verdict.node, self.nodes[verdict.node][1], verdict.named, verdict.ratio,
                                    now - since, SIGNAL_ARRIVAL, verdict.share, verdict.wait_ms,
                                    round(time.time() - (now - since), 3))
        known = self.named.get(verdict.node)
        if known is not None:
            if known.signal == SIGNAL_ARRIVAL:
                self.named[verdict.node] = one  # how long it has been so, kept up to date
            return []
        if now - since < SUSTAIN or len(self.named) >= MAX_STRAGGLERS:
            return []
        self.named[verdict.node] = one
        return [one]

    def _ratios(self, reporting: Dict[int, Tuple[NodeProgress, str]]) -> Tuple[Dict[int, float], str]:
        """The nodes at least ``ratio`` times slower than the median node, and by how much."""
        if reporting:
            rates = [(p.rate_min, n) for n, (p, _) in reporting.items() if p.rate_min is not None]
            middle = statistics.median([r for r, _ in rates]) if len(rates) >= 2 else 0.0
            if middle <= 0:
                return {}, SIGNAL_PROGRESS
            limit = middle / self.ratio
            return {n: min(RATIO_CAP, middle / r) if r > 0 else RATIO_CAP for r, n in rates if r <= limit}, \
                SIGNAL_PROGRESS
        if self.reported:  # between two starts' reports: a starting node is busy, not slow
            return {}, SIGNAL_PROGRESS
        gpus = [(p.gpu, n) for n, (p, _) in self.nodes.items() if p.gpu is not None]
        if len(gpus) >= 2:
            middle = statistics.median([g for g, _ in gpus])
            if middle < GPU_IDLE:
                return {}, SIGNAL_GPU
            return {n: min(RATIO_CAP, middle / g) if g > 0 else RATIO_CAP for g, n in gpus
                    if g * self.ratio <= middle}, SIGNAL_GPU
        cpus = [(p.cpu, n) for n, (p, _) in self.nodes.items() if p.cpu is not None]
        middle = statistics.median([c for c, _ in cpus]) if len(cpus) >= 2 else 0.0
        if middle < 0.01:  # idle ranks: nothing to compare
            return {}, SIGNAL_CPU
        return {n: min(RATIO_CAP, c / middle) for c, n in cpus if c >= middle * self.ratio}, SIGNAL_CPU

    def _fallback(self) -> str:
        return SIGNAL_GPU if sum(p.gpu is not None for p, _ in self.nodes.values()) >= 2 else SIGNAL_CPU

    def _summary(self, reporting: Dict[int, Tuple[NodeProgress, str]]) -> ProgressRecord:
        stragglers = tuple(self.named.values())
        signal = SIGNAL_PROGRESS if reporting else self._fallback() if self.nodes else None
        if not reporting:
            return ProgressRecord(signal=signal, stragglers=stragglers, stragglers_more=len(self.unlisted))
        nodes = [p for p, _ in reporting.values()]
        step = int(statistics.median_low([p.step_median for p in nodes]))
        total = max([p.total for p in nodes if p.total] or [0]) or None
        rates = [p.rate for p in nodes if p.rate is not None]
        rate = statistics.median(rates) if rates else None
        eta = (total - step) / rate if total and rate and total >= step else None
        first = min(reporting)
        return ProgressRecord(
            step=step, total=total, percent=round(100.0 * step / total, 1) if total else None,
            eta_seconds=None if eta is None else round(eta, 1),
            steps_per_second=None if rate is None else round(rate, 4),
            metrics=dict(reporting[first][0].metrics), nodes_reporting=len(reporting), signal=signal,
            measuring=rate is None,
            slowest=self._slowest(reporting, rate) if self.settled else None, stragglers=stragglers,
            stragglers_more=len(self.unlisted),
            chart_groups=tuple(label for label, _ in self._groups()), chart=tuple(self.chart))

    def _slowest(self, reporting: Dict[int, Tuple[NodeProgress, str]],
                 rate: Optional[float]) -> Optional[Dict[str, Any]]:
        rated = [(p.rate_min, n) for n, (p, _) in reporting.items() if p.rate_min is not None]
        if not rated or not rate:
            return None
        slowest, node = min(rated)
        if slowest > rate * SLOWEST_NAMED:
            return None
        progress, host = reporting[node]
        return {"node_index": node, "host": host, "ranks": _ranks(progress), "rank": progress.slowest_rank,
                "ratio": round(slowest / rate, 2)}

    def _groups(self) -> List[Tuple[str, range]]:
        count = min(CHART_GROUPS, self.num_nodes)
        spans = [range(g * self.num_nodes // count, (g + 1) * self.num_nodes // count) for g in range(count)]
        return [("node %d" % s.start if len(s) == 1 else "nodes %d-%d" % (s.start, s.stop - 1), s) for s in spans]

    def _sample(self, at: float, reporting: Dict[int, Tuple[NodeProgress, str]]) -> None:
        values: List[Optional[float]] = []
        for _, span in self._groups():
            rates = [r for r in (reporting[n][0].rate_min for n in span if n in reporting) if r is not None]
            values.append(round(min(rates), 4) if rates else None)  # the group's slowest node: a straggler shows
        self.chart.append((round(at, 1), tuple(values)))
        if len(self.chart) > CHART_SAMPLES:  # keep the whole call, at half the resolution
            self.chart = self.chart[::2]
            self.chart_every *= 2

    def line(self) -> Optional[str]:
        s = self.summary
        if s.step is None:
            return None
        parts = ["step %d%s" % (s.step, "/%d (%.0f%%)" % (s.total, s.percent or 0) if s.total else "")]
        if s.eta_seconds is not None:
            parts.append("ETA %s" % duration(s.eta_seconds))
        if s.steps_per_second is not None:
            parts.append("%.3g steps/s" % s.steps_per_second)
        elif s.measuring:
            parts.append(MEASURING if s.total else "steps/s measuring...")
        parts += ["%s %.4g" % (k, v) for k, v in list(s.metrics.items())[:4]]
        text = "progress: " + ", ".join(parts)
        if s.slowest is not None and s.nodes_reporting > 1:
            text += "; slowest: node %d (%s, ranks %s) at %.2fx the median steps/s" % (
                s.slowest["node_index"], s.slowest["host"], s.slowest["ranks"], s.slowest["ratio"])
        return text


def _ranks(progress: NodeProgress) -> str:
    if progress.rank_lo is None or progress.rank_hi is None:
        return ""
    lo, hi = progress.rank_lo, progress.rank_hi
    return "%d" % lo if lo == hi else "%d-%d" % (lo, hi)


def duration(seconds: float) -> str:
    """``45 s``, ``5 min``, ``2 h 10 min``."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return "%.0f s" % seconds
    if seconds < 5400:
        return "%.0f min" % (seconds / 60)
    return "%d h %02d min" % (seconds // 3600, seconds % 3600 // 60)
