"""A node's training progress, as its heartbeat carries it: the node sums up its
own ranks, so the control reads one small record per node whatever the ranks.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Deque, Dict, Iterable, Mapping, Optional, Tuple

from ..base.codec import Int, Real, Record, Via
from ..procs import MAX_METRICS, ProgressReport, clean_metrics, read_progress, read_statuses
from .wire import ProtocolError

STEP_LIMIT = 1 << 53
RANK_LIMIT = 1 << 31
MAX_RATE = 1e9
MAX_SECONDS = 1e9
# Steps per second over this many seconds of reports (two a second apart jump with every step).
RATE_WINDOW = 30.0
RATE_SAMPLES = 64


Steps = Annotated[int, Int(0, STEP_LIMIT - 1)]
Rank = Annotated[Optional[int], Int(0, RANK_LIMIT - 1)]
Rate = Annotated[Optional[float], Real(0.0, MAX_RATE, digits=4)]


def _metrics(value: Any) -> Dict[str, float]:
    """The same rule as a rank's own report (``procs/progress.py``), refused where it differs."""
    if not isinstance(value, Mapping) or len(value) > MAX_METRICS or clean_metrics(value) != value:
        raise ValueError("not at most %d named finite numbers" % MAX_METRICS)
    return dict(value)


@dataclass(frozen=True)
class NodeProgress(Record):
    """``rate_min`` (its slowest rank's steps/s) sets the node's pace; ``stalled``: seconds since any rank
    advanced, on its node's clock (``hang_timeout`` reads it); ``cpu`` (per rank), ``gpu`` (mean %): fallbacks."""

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

    @property
    def reporting(self) -> bool:
        return self.ranks > 0

    def problem(self) -> Optional[str]:
        if not self.step_min <= self.step_median <= self.step_max:
            return "field 'progress': steps not in order (min <= median <= max)"
        return None


class ProgressTracker:
    """Per call (a new call is a new work directory)."""

    def __init__(self, workdir: str, clock: Callable[[], float] = time.monotonic,
                 gpu: Callable[[], Optional[float]] = lambda: None) -> None:
        self.workdir = workdir
        self.clock = clock
        self.gpu = gpu
        self.history: Dict[int, Deque[Tuple[float, int]]] = {}  # rank -> (report time, step)
        self.last_steps: Dict[int, int] = {}
        self.advanced_at: Optional[float] = None
        self.cpu_seen: Optional[Tuple[float, float, int]] = None  # (clock, CPU seconds, ranks)

    def sample(self) -> Optional[NodeProgress]:
        """None while no rank reports and no CPU time or GPU utilisation is known."""
        now = self.clock()
        reports = read_progress(self.workdir)
        cpu, gpu = self._cpu(now), self.gpu()
        if not reports:
            return NodeProgress(cpu=cpu, gpu=gpu) if cpu is not None or gpu is not None else None
        if any(self.last_steps.get(r) != one.step for r, one in reports.items()) or self.advanced_at is None:
            self.advanced_at = now
        self.last_steps = {r: one.step for r, one in reports.items()}
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
            metrics=mean_metrics(reports[r].metrics for r in sorted(reports)))

    def _rate(self, one: ProgressReport) -> Optional[float]:
        seen = self.history.setdefault(one.rank, deque(maxlen=RATE_SAMPLES))
        if not seen or seen[-1] != (one.time, one.step):
            seen.append((one.time, one.step))
        while len(seen) > 2 and one.time - seen[0][0] > RATE_WINDOW:
            seen.popleft()
        (t0, s0), (t1, s1) = seen[0], seen[-1]
        return max(0.0, (s1 - s0) / (t1 - t0)) if t1 - t0 >= 1.0 else None

    def _cpu(self, now: float) -> Optional[float]:
        pids = [s.pid for s in read_statuses(self.workdir).values() if s.pid > 0 and s.end is None]
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
