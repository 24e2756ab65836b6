"""What one rank costs the others, per step: the arithmetic of gang/arrivals.py's verdict. Pure.

**What is measured.** For each collective ``k`` of a group, when each rank reached it. ``last`` is the
latest arrival and ``ref`` the latest of the *others* (the rank view: the second-latest rank; the node
view: the latest rank of the other nodes). Their gap ``lag = last - ref`` is how far the last rank is
behind: had it been on time, the collective could have begun at ``ref``.

**Where the others wait.** A rank waits only where it needs a collective's result: right after a
blocking one (a barrier, a metric's all-reduce, FSDP's all-gather before a layer), or at the end of
DDP's backward for its overlapped buckets. Between two collectives ``k-1`` and ``k`` of an interval,
either

- the others were *held* at ``k-1`` (waited for it to complete, which needs the last rank): they all
  start again together, and the lag at ``k`` is what the last rank's work of this interval added:
  ``x = lag[k]``; or
- the lag was *carried* (``k-1`` was overlapped, nobody waited for it): the last rank's work of this
  interval added ``x = lag[k] - lag[k-1]`` on top of what it was already behind.

Over a window the others' total wait is the sum of ``x`` (each lag is paid where it is held, and a
carried lag is paid once, at the step's sync point), and the step time they would have without the
late rank is the window's time less that sum: ``ratio = span / (span - sum(x))``, the step-time ratio a
user measures. DDP's buckets carry their lag through the backward (one wait a step, at the end);
FSDP's all-gathers, a barrier and blocking metric all-reduces hold it at each.

**Which it was.** Where the others reached ``k`` before the last rank had even reached ``k-1``, they
cannot have waited for ``k-1``: carried. Elsewhere the arrivals alone cannot tell (a carried lag that
grows looks like a held one that is rebuilt), so the rule takes the explanation in which the late rank
is slower *in proportion to its work*, as a slower device is: one fraction ``phi`` of each interval's
time is its extra work, fitted over the window (``fit``), and each interval is whichever of the two it
is closer to. A lag that never drops is a held one rebuilt each time (a lag carried forever would cost
nothing, and a training step always waits somewhere), so of two fits as good, the larger ``phi``.

The unit table (tests/unit/test_arrival_cost.py) checks the ratio against simulated steps of every
shape: 1 to 64 collectives a step, blocking and overlapped, DDP, FSDP, barriers, 1.05x to 3x.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

PHI_TOP = 0.8  # the largest fraction of a step fitted: a rank 5x slower
RESIDUAL_CAP = 1.0  # an interval that fits neither explanation weighs no more than this
NEAR = 2.0  # fits within this factor of the best one (and ...)
NEAR_EACH = 0.002  # ... this much an interval) are as good: the larger phi is taken
SHORT = 0.25  # an interval shorter than this fraction of the median weighs as one of that length
PERSISTENT = 0.5  # a rank last at both ends of this share of the intervals is late throughout ...
MOST = 128  # ... and a fit that builds its lag once in fewer than this many intervals builds it too seldom


class Arrival(NamedTuple):
    """One collective as the gang reached it, on one clock (ns): the last arrival, whose, and the
    latest of the others'."""

    last: float
    who: int
    ref: float


class Pair(NamedTuple):
    """Two successive collectives of one group: what an interval adds to the last rank's lag."""

    gap: float  # the last arrivals' spacing, ns: the interval's time on the gang's critical path
    lag: float  # at the second collective, ns
    lag_before: float  # at the first
    carried: bool  # the others reached the second before the last rank reached the first
    who: int  # the last at the second collective: whose work made this interval's lag
    who_before: int  # the last at the first


def pair(before: Arrival, after: Arrival) -> Pair:
    return Pair(after.last - before.last, after.last - after.ref, before.last - before.ref,
                after.ref < before.last, after.who, before.who)


def _rows(pairs: Sequence[Pair]) -> List[Tuple[float, float, float]]:
    """Each interval as (carried x, held x, its time) over its weighing length: fractions of a step."""
    gaps = sorted(p.gap for p in pairs)
    floor = max(1.0, SHORT * gaps[len(gaps) // 2]) if gaps else 1.0
    rows = []
    for p in pairs:
        weigh = max(p.gap, floor)
        rows.append(((p.lag - p.lag_before) / weigh, p.lag / weigh if not p.carried else INF,
                     max(0.0, p.gap) / weigh))
    return rows


INF = float("inf")


def _residual(row: Tuple[float, float, float], phi: float) -> float:
    carried, held, time = row
    return min(abs(carried - phi * time), abs(held - phi * time), RESIDUAL_CAP)


def _kinks(row: Tuple[float, float, float]) -> List[float]:
    """Where one interval's residual, a function of phi, bends: between two, it is a straight line."""
    carried, held, time = row
    if time <= 0:
        return []
    ends = [carried, carried - RESIDUAL_CAP, carried + RESIDUAL_CAP]
    if held != INF:
        ends += [held, held - RESIDUAL_CAP, held + RESIDUAL_CAP, (carried + held) / 2]
    return [e / time for e in ends if 0.0 < e / time < PHI_TOP]


def _costs(rows: Sequence[Tuple[float, float, float]]) -> List[Tuple[float, float]]:
    """The fit's cost at every phi where it bends (and at 0 and ``PHI_TOP``): (phi, cost), in order. Each
    interval adds a broken line; their sum is swept once, from the changes of slope (n log n)."""
    changes: Dict[float, float] = {}
    at_zero, slope = 0.0, 0.0
    for row in rows:
        points = [0.0] + sorted(set(_kinks(row))) + [PHI_TOP]
        values = [_residual(row, phi) for phi in points]
        slopes = [(v1 - v0) / (p1 - p0) for p0, p1, v0, v1 in zip(points, points[1:], values, values[1:])]
        at_zero += values[0]
        slope += slopes[0]
        for phi, before, after in zip(points[1:-1], slopes, slopes[1:]):
            changes[phi] = changes.get(phi, 0.0) + after - before
    out, value, last = [(0.0, at_zero)], at_zero, 0.0
    for phi in sorted(changes) + [PHI_TOP]:
        value += slope * (phi - last)
        out.append((phi, value))
        slope += changes.get(phi, 0.0)
        last = phi
    return out


def fit(pairs: Sequence[Pair]) -> float:
    """The late rank's extra work as a fraction of each interval's time that best explains the lags."""
    rows = _rows(pairs)
    if not rows:
        return 0.0
    costs = _costs(rows)
    best = min(c for _, c in costs)
    good = [phi for i, (phi, c) in enumerate(costs) if c <= NEAR * best + NEAR_EACH * len(rows)
            and (i == 0 or c <= costs[i - 1][1] + 1e-9) and (i == len(costs) - 1 or c <= costs[i + 1][1] + 1e-9)]
    return max(good)


def extra_work(pairs: Sequence[Pair], phi: float) -> List[float]:
    """Each interval's x (ns): held or carried, whichever ``phi`` explains better."""
    out = []
    for p, (c, h, s) in zip(pairs, _rows(pairs)):
        held = abs(h - phi * s) <= abs(c - phi * s)
        out.append(p.lag if held else p.lag - p.lag_before)
    return out


class Cost(NamedTuple):
    """Who the others wait for in a window: ``share`` of all the waiting is for it, ``waited`` of each
    second (a fraction), and so a step takes ``ratio`` times what it would without it."""

    who: int
    share: float
    waited: float
    ratio: float
    seen: int


def rebuilt(pairs: Sequence[Pair]) -> List[float]:
    """Each interval's x where every lag that could have been built within its interval was (held), the
    rest carried: a late rank that is never held, whatever the fit, is no late rank (see ``cost``)."""
    return [p.lag if not p.carried and 0 <= p.lag <= PHI_TOP * p.gap else p.lag - p.lag_before for p in pairs]


def cost(pairs: Sequence[Pair]) -> Optional[Cost]:
    """The one whose lags cost the others most over ``pairs``, and what it costs them; None where there
    is no time or nobody's lag costs anything. ``phi`` is fitted to the intervals the most often late one
    is last at both ends of (not to the others': a window that began before it was late, an even gang's
    turns), the rest are explained with it. Where that one is late nearly throughout and the fit carries
    its lag everywhere (its extra work was not in proportion: a slow data loader's, all before the
    step's first collective), the lags are taken as built where they could be: a training step waits
    for every rank at least once, so a lag always there is one paid and built again."""
    span = sum(p.gap for p in pairs if p.gap > 0)
    if not pairs or span <= 0:
        return None
    often: Dict[int, float] = {}
    for p in pairs:
        often[p.who] = often.get(p.who, 0.0) + max(0.0, p.lag)
    suspect = max(often, key=lambda w: (often[w], -w))
    own = [p for p in pairs if p.who == p.who_before == suspect]
    found = extra_work(pairs, fit(own if len(own) >= len(pairs) // 4 else pairs))
    if len(own) >= PERSISTENT * len(pairs):
        lags = sorted(p.lag for p in own)
        if sum(x for p, x in zip(pairs, found) if p.who == suspect) < lags[len(lags) // 2] * len(pairs) / MOST:
            found = rebuilt(pairs)  # not even once in MOST intervals: never
    each: Dict[int, float] = {}
    for p, x in zip(pairs, found):
        each[p.who] = each.get(p.who, 0.0) + x
    who = max(each, key=lambda w: (each[w], -w))
    caused = each[who]
    total = sum(v for v in each.values() if v > 0)
    if caused <= 0 or total <= 0:
        return None
    waited = min(caused / span, 0.99)
    return Cost(who, caused / total, waited, 1.0 / (1.0 - waited), len(pairs))
