"""The gang's training progress as the control sees it, and its stragglers.

A heartbeat's progress costs the service one dictionary entry; once a second
the book sums up the gang, samples the card's chart (the same size at any gang
size) and names each straggler once. The signals (steps/s, else GPU
utilisation, else CPU) and why each works: docs/seeing-the-gang.md.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Annotated, Any, Dict, List, Optional, Set, Tuple

from ..base.codec import LOCAL, Real, Written
from .node_progress import NodeProgress

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


@dataclass(frozen=True)
class Straggler(Written):
    node_index: int
    host: str
    ranks: str  # "136-143"
    ratio: Annotated[float, Real(digits=2)]
    seconds: Annotated[float, Real(digits=1)]
    signal: str

    def sentence(self) -> str:
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
    # For the card: seconds since the call's first report, and steps/s per group of nodes.
    chart_groups: Annotated[Tuple[str, ...], LOCAL] = ()
    chart: Annotated[Tuple[Tuple[float, Tuple[Optional[float], ...]], ...], LOCAL] = ()


class ProgressBook:
    def __init__(self, num_nodes: int, ratio: float, window: float) -> None:
        self.num_nodes = num_nodes
        self.ratio = ratio
        self.window = window
        self.nodes: Dict[int, Tuple[NodeProgress, str]] = {}
        self.started: Optional[float] = None
        self.slow_since: Dict[int, float] = {}
        self.named: Dict[int, Straggler] = {}
        self.unlisted: Set[int] = set()
        self.chart: List[Tuple[float, Tuple[Optional[float], ...]]] = []
        self.chart_every = 5.0
        self.next_sample = 0.0
        self.summary = ProgressRecord()

    def new_call(self) -> None:
        """Stragglers named stay named."""
        self.nodes.clear()
        self.slow_since.clear()
        self.chart = []
        self.started = None
        self.chart_every = 5.0
        self.summary = ProgressRecord(stragglers=self.summary.stragglers, stragglers_more=len(self.unlisted))

    def update(self, node: int, host: str, progress: Optional[NodeProgress]) -> None:
        if progress is None:
            self.nodes.pop(node, None)
        else:
            self.nodes[node] = (progress, host)

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
        reporting = {n: ph for n, ph in self.nodes.items() if ph[0].reporting}
        named = self._stragglers(now, reporting)
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
            slowest=self._slowest(reporting, rate), stragglers=stragglers, stragglers_more=len(self.unlisted),
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
