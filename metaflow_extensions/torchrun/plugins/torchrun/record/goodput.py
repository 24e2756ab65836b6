"""The goodput ledger: where a step's wall time went, across its attempts.

At scale failures are routine; what says whether a job runs well is the share
of wall time spent training. Each attempt, and each in-step restart, is one
segment cut into ``PARTS`` that never overlap, so they add up to the wall time
(docs/resume.md's table says where each starts and ends). Read from the
attempts record alone: the ranks do no extra work for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..base.codec import SKIP, Int, Items, Lenient, OneOf, Real, Text, Via
from ..base.text import count, first_line
from .attempts import Attempt, Marks, Whole, in_step_cuts, lost_since, marks
from .in_step_restarts import Node

PARTS = ("productive", "gang", "startup", "checkpoint", "lost_work", "stop", "restart", "other")
LOST_PARTS = ("lost_work", "stop", "restart")
METADATA_FIELD = "torchrun-goodput"
ARTIFACT = "torchrun_goodput"
MAX_SEGMENTS = 256

Seconds = Annotated[float, Real(digits=3)]
# A segment's parts, those it has, each as many seconds.
Parts = Annotated[Dict[Annotated[str, OneOf(PARTS)], Seconds], Items(len(PARTS))]


def _all_parts(parts: Any) -> Dict[str, float]:
    """The ledger's parts, every one of them (a bad or absent one: none spent)."""
    parts = parts if isinstance(parts, Mapping) else {}
    return {k: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else 0.0
            for k in PARTS for v in [parts.get(k)]}


def _parts_written(parts: Mapping[str, float]) -> Dict[str, float]:
    return {k: round(parts.get(k, 0.0), 3) for k in PARTS}


def _latest(segments: Tuple["Segment", ...]) -> List[Dict[str, Any]]:
    return [s.to_wire() for s in segments[-MAX_SEGMENTS:]]


@dataclass(frozen=True)
class Segment(Lenient):
    """One attempt (or one in-step restart of it) on the step's clock."""

    WIRE_ORDER = ("attempt", "restart", "started_at", "ended_at", "seconds", "parts", "cause", "lost_seconds",
                  "time_to_restart", "swapped_out", "swapped_in", "steps_lost")
    attempt: Whole
    started_at: float
    ended_at: float
    parts: Parts = field(default_factory=dict)
    restart: Optional[Whole] = None
    cause: Annotated[Optional[str], Text(400)] = None  # why it stopped; None: it succeeded
    # A failure's cost: its lost parts; the failure to the next first line.
    lost_seconds: Seconds = 0.0
    time_to_restart: Optional[Seconds] = None
    # A swap ended it (@torchrun(spares)): the node taken out, the spare brought in.
    swapped_out: Optional[Node] = None
    swapped_in: Optional[Node] = None
    # Its ranks came back from a snapshot in memory: the steps it lost (None: from your checkpoint).
    steps_lost: Annotated[Optional[int], Int(0, (1 << 53) - 1), SKIP] = None

    @property
    def seconds(self) -> Seconds:
        return self.ended_at - self.started_at


@dataclass(frozen=True)
class Ledger(Lenient):
    """The step's wall time, its parts, and the segments they came from (the latest ``MAX_SEGMENTS``)."""

    WIRE_ORDER = ("started_at", "ended_at", "wall_seconds", "effective_percent", "lost_seconds", "parts", "segments")
    started_at: float
    ended_at: float
    parts: Annotated[Dict[str, float], Via(_all_parts, _parts_written)]
    segments: Annotated[Tuple[Segment, ...], Items(MAX_SEGMENTS), Via(None, _latest)] = ()

    @property
    def wall_seconds(self) -> Seconds:
        return self.ended_at - self.started_at

    @property
    def effective_percent(self) -> Annotated[float, Real(digits=2)]:
        wall = self.wall_seconds
        return 100.0 * self.parts.get("productive", 0.0) / wall if wall > 0 else 0.0

    @property
    def lost_seconds(self) -> Seconds:
        return sum(self.parts.get(p, 0.0) for p in LOST_PARTS)

    def summary(self) -> str:
        """``effective training 71.2% of 3m 20s; lost to failures 41.0s (...)``."""
        wall = self.wall_seconds
        rest = ", ".join("%s %s" % (p.replace("_", " "), _dur(self.parts[p])) for p in PARTS[1:]
                         if self.parts.get(p, 0.0) >= 0.05)
        restarts = sum(1 for s in self.segments if s.restart is not None)
        swaps = sum(1 for s in self.segments if s.swapped_in is not None)
        again = " and " + count(restarts, "in-step restart") + (" (%s)" % count(swaps, "swap") if swaps else "")
        return "effective training %.1f%% of %s over %s%s%s" % (
            self.effective_percent, _dur(wall), count(len({s.attempt for s in self.segments}), "attempt"),
            again if restarts else "", "; the rest: " + rest if rest else "")


def segments(a: Attempt, end: float, after_failure: bool, saved_at: Optional[float], failed: bool,
             next_first: Optional[float]) -> List[Segment]:
    """One attempt's segments, one more after each in-step restart, which loses all its ranks' work
    (the node cannot see which checkpoint the new ranks load) but what a snapshot in memory kept."""
    m: Marks = marks(a, min(a.recorded_at, end) if a.recorded_at is not None else end)
    first, cuts = in_step_cuts(a, m)
    parts = dict.fromkeys(PARTS, 0.0)
    parts["restart" if after_failure else "gang"] += m.formed - m.start
    parts["restart" if after_failure else "startup"] += first - m.formed
    out: List[Segment] = []
    seg_start, work_from, number = m.start, first, None
    for i, c in enumerate(cuts):
        kept = min(max(c.mark.kept_until, work_from), c.failed) if c.mark.kept_until is not None else work_from
        parts["productive"] += kept - work_from  # resumed from a snapshot in memory: the work up to it stands
        parts["lost_work"] += c.failed - kept
        parts["stop"] += c.stopped - c.failed
        out.append(Segment(attempt=a.attempt, started_at=seg_start, ended_at=c.stopped, parts=parts, restart=number,
                           cause=c.mark.label, lost_seconds=parts["lost_work"] + parts["stop"] + c.back - c.stopped,
                           time_to_restart=c.back - c.failed, swapped_out=c.mark.swapped_out,
                           swapped_in=c.mark.swapped_in, steps_lost=c.mark.steps_lost))
        parts = dict.fromkeys(PARTS, 0.0)
        parts["restart"] += c.trained - c.stopped  # to the new ranks' first snapshot, where they save
        seg_start, work_from, number = c.stopped, c.trained, i + 1
    if failed:
        since = lost_since(m, saved_at, work_from)
        parts["productive"] += since - work_from
        parts["lost_work"] += m.work_end - since
        parts["stop"] += m.end - m.work_end
        parts["restart"] += end - m.end
    else:
        parts["productive"] += m.work_end - work_from
        parts["other"] += (m.end - m.work_end) + (end - m.end)
    lost = parts["lost_work"] + parts["stop"] + (end - m.end if failed else 0.0)
    out.append(Segment(attempt=a.attempt, started_at=seg_start, ended_at=end, parts=parts, restart=number,
                       cause=a.stopped if failed else None, lost_seconds=lost if failed else 0.0,
                       time_to_restart=(next_first - m.work_end) if failed and next_first is not None else None))
    return out


def ledger(attempts: Sequence[Attempt], now: float) -> Optional[Ledger]:
    """The ledger of every attempt so far (this one's recorded at ``now``); None without a start."""
    known = [a for a in attempts if a.started_at is not None]
    if not known:
        return None
    known.sort(key=lambda a: a.started_at or 0.0)
    found: List[Segment] = []
    after_failure = False
    for i, a in enumerate(known):
        nxt = known[i + 1] if i + 1 < len(known) else None
        end = (nxt.started_at or now) if nxt is not None else max(now, a.started_at or now)
        failed = a.stopped != "succeeded"
        saved = nxt.resumed_from.created_at if nxt is not None and nxt.resumed_from is not None else None
        next_first = marks(nxt, now).first if nxt is not None else None
        found.extend(segments(a, end, after_failure, saved, failed, next_first))
        after_failure = failed
    totals = {k: sum(s.parts.get(k, 0.0) for s in found) for k in PARTS}
    return Ledger(found[0].started_at, found[-1].ended_at, totals, tuple(found))


def bar_spec(led: Ledger) -> Dict[str, Any]:
    """A Vega-Lite chart for the card: one stacked bar per attempt."""
    values = [{"attempt": segment_label(s),
               "part": k.replace("_", " "), "seconds": round(v, 3), "order": PARTS.index(k)}
              for s in led.segments[-64:] for k, v in s.parts.items() if v > 0]
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "width": 600, "height": max(40, 28 * len(led.segments[-64:])),
        "data": {"values": values},
        "mark": "bar",
        "encoding": {
            "y": {"field": "attempt", "type": "nominal", "sort": None, "title": None},
            "x": {"field": "seconds", "type": "quantitative", "stack": "zero"},
            "order": {"field": "order", "type": "quantitative"},
            "color": {"field": "part", "type": "nominal",
                      "scale": {"domain": [p.replace("_", " ") for p in PARTS],
                                "range": ["#54a24b", "#9ecae9", "#4c78a8", "#b279a2", "#e45756",
                                          "#f58518", "#ff9d98", "#bab0ac"]}},
            "tooltip": [{"field": "attempt"}, {"field": "part"}, {"field": "seconds"}],
        },
    }


def segment_label(s: Segment) -> str:
    """``attempt 0``; ``attempt 0, after restart 1`` (a swap is a restart too): a segment in words."""
    if s.restart is None:
        return "attempt %d" % s.attempt
    return "attempt %d, after restart %d" % (s.attempt, s.restart)


def stopped_words(s: Segment) -> str:
    """Why a segment stopped, on one short line (the Restarts and Root cause sections have it whole)."""
    if not s.cause:
        return "succeeded"
    line = first_line(s.cause)
    return line if len(line) <= STOPPED_CHARS else line[:STOPPED_CHARS] + "…"


def rows(led: Ledger) -> List[List[str]]:
    """The card's table: one row per segment, the seconds of each part, the steps its failure lost."""
    return [[segment_label(s), _dur(s.seconds)] + ["%.1f" % s.parts.get(p, 0.0) for p in PARTS]
            + ["" if s.steps_lost is None else str(s.steps_lost), stopped_words(s)] for s in led.segments[-64:]]


HEADERS = ["segment", "wall"] + [p.replace("_", " ") + " (s)" for p in PARTS] + ["steps lost (from memory)",
                                                                                 "stopped (first line)"]
STOPPED_CHARS = 120


def _dur(seconds: float) -> str:
    if seconds < 60:
        return "%.1fs" % seconds
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return "%dm %02ds" % (minutes, secs)
    return "%dh %02dm" % divmod(minutes, 60)

