"""The card's timeline: a Vega-Lite chart (Metaflow's ``VegaChart``, offline) of nodes, ranks, calls,
swaps and the failure on one time axis. Pure: a ``TorchrunResult`` in, a spec out. Its size does not
grow with the gang (nodes in groups past ``NODE_LANES``, ``RANK_LANES`` ranks, the last ``CALL_MARKS``
calls), and every value in it is a number or a string written here: no text from a rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..cause import CauseKind
from ..gang.arrivals import SIGNAL_ARRIVAL
from . import starts as card_starts
from .starts import RankRun

# Lanes of nodes (a bigger gang in groups) and of ranks; the last calls and swaps marked; a host's chars.
NODE_LANES = 32
RANK_LANES = 32
CALL_MARKS = 20
SWAP_MARKS = 8
RESTART_MARKS = 8
HOST_CHARS = 40
# Fixed: VegaChart's "container" width is measured before the card's layout settles and can come out 0.
LANE_PX = 16
WIDTH_PX = 640
SCHEMA = "https://vega.github.io/schema/vega-lite/v6.json"  # read for its version only, never fetched

# The legend's states, in order, with their colours.
STATES = (
    ("node", "#4c78a8"),
    ("nodes joining", "#9ecae9"),
    ("node: spare", "#dadaeb"),
    ("node: taken out", "#7f7f7f"),
    ("rank: exit 0", "#54a24b"),
    ("rank: failed", "#e45756"),
    ("rank: stopped", "#f58518"),
    ("rank: no exit", "#bab0ac"),
)
# Exits that mean "stopped from outside" (the agent's SIGTERM, SIGKILL after its grace).
_STOPPED = (-15, -9)


@dataclass(frozen=True)
class Gang:
    num_nodes: int
    joined: Mapping[int, float]
    finished: Mapping[int, float]
    ranks: Mapping[int, Sequence[Any]]  # node -> its ranks' records (RankStatus)
    calls: Sequence[Tuple[int, float]] = ()  # (0-based call index, started at)
    failed_at: Optional[float] = None
    failed_node: Optional[int] = None
    failed_rank: Optional[int] = None
    ended_at: Optional[float] = None
    failed_kind: Optional[CauseKind] = None
    swaps: Sequence[Tuple[float, str]] = ()  # (at, label): a node taken out for a spare
    # @torchrun(spares): a benched node's lane, as (from, state) in order (None: from its join).
    bench: Mapping[int, Sequence[Tuple[Optional[float], str]]] = field(default_factory=dict)
    # Every start's ranks (card/starts.py); empty: ``ranks`` alone, one start.
    runs: Sequence[RankRun] = ()
    restarts: Sequence[Tuple[float, str]] = ()  # (at, label): a restart in place, at its failure
    swapped_in: Mapping[int, int] = field(default_factory=dict)  # node -> the start a swap brought it in at
    late: Sequence[Tuple[float, str]] = ()  # (since, label): a node the others waited for at the collectives


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _index(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def from_result(result: Any, ranks: Mapping[int, Sequence[Any]]) -> Gang:
    """The chart's input, from a result and its rank records per node; the attempt's calls, else this one."""
    joined = {k: t for k, v in result.gang.joined_at.items() if (t := _number(v)) is not None}
    finished = {k: t for k, v in result.gang.finished_at.items() if (t := _number(v)) is not None}
    if not joined:
        joined = {result.node_index: result.started_at}
        finished = {result.node_index: result.ended_at}
    calls: List[Tuple[int, float]] = []
    if result.attempts:
        calls = [(c.call, c.started_at) for c in result.attempts[-1].calls
                 if _index(c.call) is not None and _number(c.started_at) is not None]
    if not calls and _index(result.call) is not None:
        calls = [(result.call, result.started_at)]
    cause = result.cause
    failed_node = _index(cause.node_index) if cause is not None else None
    failed_rank = _index(cause.rank) if cause is not None else None
    # Drawn where the failing rank ended, not when its node reported it (seconds later).
    failed_at = _rank_end(ranks, failed_node, failed_rank) or (_number(cause.time) if cause is not None else None)
    return Gang(
        num_nodes=max(1, int(result.num_nodes or 1)), joined=joined, finished=finished, ranks=ranks, calls=calls,
        failed_at=failed_at, failed_node=failed_node, failed_rank=failed_rank, ended_at=_number(result.ended_at),
        failed_kind=cause.kind if cause is not None else None, swaps=swaps_of(result), bench=bench_of(result),
        runs=card_starts.rank_runs(result, ranks), restarts=restarts_of(result),
        swapped_in={n: r.restart for r in result.in_step_restarts or () if (n := _index(r.swapped_in)) is not None},
        late=late_of(result),
    )


def late_of(result: Any) -> List[Tuple[float, str]]:
    """Where the gang began to wait for a node at the collectives (the arrival signal): ``node 1 late
    (ranks 2-3): 190 ms a second`` (numbers only, never a host's text)."""
    found = []
    for s in (result.progress.stragglers if result.progress is not None else ()):
        at, node = _number(s.since), _index(s.node_index)
        if at is None or node is None or s.signal != SIGNAL_ARRIVAL:
            continue
        ranks = "".join(c for c in str(s.ranks) if c.isdigit() or c in ",-")[:32]
        found.append((at, "node %d late (ranks %s): %.0f ms a second" % (node, ranks, _number(s.wait_ms) or 0.0)))
    return sorted(found)[-SWAP_MARKS:]


def bench_of(result: Any) -> Dict[int, List[Tuple[Optional[float], str]]]:
    """Each benched node's lane: a spare waits until a swap brings it in; a node taken out trains until
    its swap (not at all where the preflight took it out)."""
    lanes: Dict[int, List[Tuple[Optional[float], str]]] = {}
    for r in sorted(result.in_step_restarts or (), key=lambda r: r.failed_at):
        at, out, came_in = _number(r.failed_at), _index(r.swapped_out), _index(r.swapped_in)
        if at is not None and out is not None and came_in is not None:
            lanes[out] = [(None, "node"), (at, "node: taken out")]
            lanes[came_in] = [(None, "node: spare"), (at, "node")]
    for node in result.out_nodes or ():
        lanes.setdefault(node, [(None, "node: taken out")])
    for node in result.spare_nodes or ():
        lanes.setdefault(node, [(None, "node: spare")])
    return lanes


def swaps_of(result: Any) -> List[Tuple[float, str]]:
    """Each swap of the call at its failure: ``node 1 (host) out, spare node 2 (host) in: rank 3 failed``
    (hosts from the attempt's record; the cause by numbers and kind, never its text)."""
    hosts: Dict[int, str] = {}
    for mark in (result.attempts[-1].restarts if result.attempts else ()):
        for node, host in ((mark.swapped_out, mark.out_host), (mark.swapped_in, mark.in_host)):
            if node is not None and host:
                hosts[node] = _plain(host)
    found = []
    for r in result.in_step_restarts or ():
        at, out, came_in = _number(r.failed_at), _index(r.swapped_out), _index(r.swapped_in)
        if at is None or out is None or came_in is None:
            continue
        rank = _index(r.cause.rank)
        what = "rank %d failed" % rank if rank is not None else r.cause.kind.value.replace("_", " ")
        found.append((at, "node %d (%s) out, spare node %d (%s) in: %s" % (
            out, hosts.get(out, "?"), came_in, hosts.get(came_in, "?"), what)))
    return sorted(found)[-SWAP_MARKS:]


def restarts_of(result: Any) -> List[Tuple[float, str]]:
    """Each restart in place at its failure: ``restart 1: rank 3 (node 1) failed`` (numbers and the
    cause's kind, never its text)."""
    found = []
    for r in result.in_step_restarts or ():
        at = _number(r.failed_at)
        if at is None or _index(r.swapped_in) is not None:
            continue
        rank, node = _index(r.cause.rank), _index(r.cause.node_index)
        what = ("rank %d (node %d) failed" % (rank, node) if rank is not None and node is not None
                else "node %d: " % node if node is not None else "") + (
            "" if rank is not None and node is not None else r.cause.kind.value.replace("_", " "))
        found.append((at, "restart %d: %s" % (r.restart, what)))
    return sorted(found)[-RESTART_MARKS:]


def _plain(host: str) -> str:
    """A host name's own characters, bounded."""
    kept = "".join(c for c in host if c.isalnum() or c in ".-_:")
    return kept[:HOST_CHARS] or "?"


def _rank_end(ranks: Mapping[int, Sequence[Any]], node: Optional[int], rank: Optional[int]) -> Optional[float]:
    records = (ranks.get(node) or ()) if node is not None and rank is not None else ()
    return next((_number(r.end) for r in records if r.rank == rank), None)


def rank_state(record: Any, failed_rank: Optional[int]) -> str:
    code = record.exit_code
    if not isinstance(code, int) or isinstance(code, bool):
        return "rank: no exit"
    if code == 0:
        return "rank: exit 0"
    if code in _STOPPED and record.rank != failed_rank:
        return "rank: stopped"
    return "rank: failed"


def _node_groups(num_nodes: int) -> List[Tuple[int, int]]:
    """Consecutive node ranges, one per lane, at most ``NODE_LANES``."""
    size = max(1, math.ceil(num_nodes / NODE_LANES))
    return [(first, min(num_nodes, first + size) - 1) for first in range(0, num_nodes, size)]


def _node_rows(g: Gang, origin: float, end: float) -> List[Dict[str, Any]]:
    rows: List[Dict[str, Any]] = []
    for first, last in _node_groups(g.num_nodes):
        nodes = range(first, last + 1)
        joins = [g.joined[n] for n in nodes if n in g.joined]
        ends = [g.finished.get(n, end) for n in nodes if n in g.joined]
        missing = len(nodes) - len(joins)
        lane = "node %d" % first if first == last else "nodes %d-%d" % (first, last)
        if not joins:
            rows.append({"lane": lane + " (never joined)", "kind": "node"})
            continue
        if missing:
            lane += " (%d never joined)" % missing
        a, b, z = min(joins) - origin, max(joins) - origin, max(ends) - origin
        if b > a and first != last:
            rows.append({"lane": lane, "state": "nodes joining", "start": a, "end": b,
                         "tip": "%d nodes joined from +%.1f s to +%.1f s" % (len(joins), a, b)})
        if first == last and first in g.bench:
            rows += _bench_rows(lane, g.bench[first], origin, a, z, end - origin)
            continue
        rows.append({"lane": lane, "state": "node", "start": b if first != last else a, "end": z,
                     "tip": "%s: %s +%.1f s, finished +%.1f s" % (
                         lane, "joined" if first == last else "all joined", b, z)})
    return rows


def _bench_rows(lane: str, states: Sequence[Tuple[Optional[float], str]], origin: float, joined: float,
                finished: float, call_end: float) -> List[Dict[str, Any]]:
    """A benched node's lane, a bar per state clamped to its join and finish; one benched at the end sat
    the call out to its end (the gang counts it done once benched)."""
    rows: List[Dict[str, Any]] = []
    if states and states[-1][1] != "node":
        finished = max(finished, call_end)
    for i, (at, state) in enumerate(states):
        start = joined if at is None else min(max(at - origin, joined), finished)
        nxt = states[i + 1][0] if i + 1 < len(states) else None
        stop = finished if nxt is None else min(max(nxt - origin, start), finished)
        what = {"node": "trained", "node: spare": "a spare, waiting", "node: taken out": "taken out"}[state]
        rows.append({"lane": lane, "state": state, "start": start, "end": stop,
                     "tip": "%s: %s from +%.1f s to +%.1f s" % (lane, what, start, stop)})
    return rows


def _lane_counts(g: Gang) -> Dict[int, int]:
    """Each node's rank lanes: one per rank, whatever its starts."""
    if not g.runs:
        return {node: len(records) for node, records in g.ranks.items()}
    ranks: Dict[int, set] = {}
    for run in g.runs:
        ranks.setdefault(run.node, set()).add(run.rank)
    return {node: len(found) for node, found in ranks.items()}


def _first_nodes(g: Gang) -> List[int]:
    """The failing nodes first: the call's, then each replaced start's."""
    found = [g.failed_node] if g.failed_node is not None else []
    found += [run.node for run in g.runs if run.state == "rank: failed"]
    return list(dict.fromkeys(found))


def _rank_nodes(g: Gang) -> List[int]:
    """The nodes whose ranks get lanes: the failing ones, then from node 0 on, while ``RANK_LANES`` allows."""
    chosen: List[int] = []
    room = RANK_LANES
    counts = _lane_counts(g)
    order = [n for n in _first_nodes(g) if n in counts] + sorted(counts)
    for node in order:
        count = counts[node]
        if node in chosen or count == 0:
            continue
        if count > room and chosen:
            break
        chosen.append(node)
        room -= count
    return sorted(chosen)


def _run_rows(g: Gang, origin: float, end: float) -> List[Dict[str, Any]]:
    """A lane per rank, a bar per start of it: the replaced starts' failed rank and bystanders, then the last."""
    rows: List[Dict[str, Any]] = []
    nodes = _rank_nodes(g)
    for node in nodes:
        runs = sorted((r for r in g.runs if r.node == node), key=lambda r: (r.rank, r.start))
        lanes = sorted({r.rank for r in runs})[:RANK_LANES]
        for run in runs:
            start = _number(run.record.start)
            if run.rank not in lanes or start is None:
                continue
            stop = run.end if run.end is not None else end
            code = run.record.exit_code
            rows.append({
                "lane": "rank %d (node %d)" % (run.rank, node), "state": run.state, "start": start - origin,
                "end": max(stop, start) - origin,
                "tip": "rank %d on node %d, start %d: %s, %s" % (
                    run.rank, node, run.start, run.state.split(": ", 1)[-1] + (
                        " (exit %d)" % code if isinstance(code, int) and run.state != "rank: exit 0" else ""),
                    "%.1f s" % (stop - start)),
            })
    return rows


def _rank_rows(g: Gang, origin: float, end: float) -> List[Dict[str, Any]]:
    if g.runs:
        return _run_rows(g, origin, end)
    rows: List[Dict[str, Any]] = []
    for node in _rank_nodes(g):
        records = sorted(g.ranks[node], key=lambda r: _index(r.rank) or 0)
        for r in records[:RANK_LANES]:
            rank, start = _index(r.rank), _number(r.start)
            if rank is None or start is None:
                continue
            stop = _number(r.end)
            state = rank_state(r, g.failed_rank)
            code = r.exit_code
            rows.append({
                "lane": "rank %d (node %d)" % (rank, node), "state": state, "start": start - origin,
                "end": (stop if stop is not None else end) - origin,
                "tip": "rank %d on node %d: %s, %s" % (
                    rank, node, "exit %d" % code if isinstance(code, int) else "no exit",
                    "%.1f s" % (stop - start) if stop is not None else "no end"),
            })
    return rows


def _call_rows(g: Gang, origin: float) -> Tuple[List[Dict[str, Any]], int]:
    calls = sorted(g.calls, key=lambda c: c[1])
    shown = calls[-CALL_MARKS:]
    return [{"at": t - origin, "label": "call %d" % (i + 1)} for i, t in shown], len(calls) - len(shown)


def _failure_label(g: Gang) -> str:
    """Numbers and the cause's kind (a name of ``CauseKind``), never its text."""
    if g.failed_rank is not None and g.failed_node is not None:
        return "failed: rank %d (node %d)" % (g.failed_rank, g.failed_node)
    what = g.failed_kind.value.replace("_", " ") if g.failed_kind is not None else "failed"
    if g.failed_node is not None:
        return "node %d: %s" % (g.failed_node, what)
    return "gang stopped: %s" % what


def spec(g: Gang) -> Dict[str, Any]:
    """One layered chart: lanes of nodes then ranks, seconds from the first node's join."""
    origin = min(g.joined.values()) if g.joined else 0.0
    ends = list(g.finished.values()) + ([g.ended_at] if g.ended_at is not None else [])
    end = max(ends + [origin + 1e-3])
    lanes = _node_rows(g, origin, end) + _rank_rows(g, origin, end)
    order = list(dict.fromkeys(row["lane"] for row in lanes))
    bars = [row for row in lanes if "start" in row]
    used = {row["state"] for row in bars}
    legend = [(state, colour) for state, colour in STATES if state in used]
    calls, calls_left_out = _call_rows(g, origin)
    x = {"field": "start", "type": "quantitative", "title": "seconds from the first node's join"}
    y = {"field": "lane", "type": "nominal", "sort": order, "title": None}
    layers: List[Dict[str, Any]] = [{
        "data": {"values": bars},
        "mark": {"type": "bar", "height": {"band": 0.7}},
        "encoding": {
            "x": x, "x2": {"field": "end"}, "y": y,
            "color": {"field": "state", "type": "nominal", "title": None,
                      "scale": {"domain": [s for s, _ in legend], "range": [c for _, c in legend]},
                      "legend": {"orient": "bottom"}},
            "tooltip": [{"field": "tip", "type": "nominal", "title": "what"}],
        },
    }]
    layers += _mark_layers(calls, "call", "#555", {"align": "left", "dx": 3, "dy": -4, "fontSize": 10},
                           {"strokeDash": [2, 2]})
    if g.restarts:
        restarts = [{"at": at - origin, "label": label} for at, label in g.restarts]
        layers += _mark_layers(restarts, "restart", "#d62728", {"align": "left", "dx": 3, "dy": -16, "fontSize": 10,
                                                                "fontWeight": "bold"},
                               {"strokeWidth": 2, "strokeDash": [6, 2]})
    if g.swaps:
        swaps = [{"at": at - origin, "label": label} for at, label in g.swaps]
        layers += _mark_layers(swaps, "swap", "#9467bd", {"align": "left", "dx": 3, "dy": -16, "fontSize": 10},
                               {"strokeWidth": 2, "strokeDash": [6, 2]})
    if g.late:
        late = [{"at": at - origin, "label": label} for at, label in g.late]
        layers += _mark_layers(late, "straggler", "#bcbd22", {"align": "left", "dx": 3, "dy": -28, "fontSize": 10},
                               {"strokeWidth": 2, "strokeDash": [1, 3]})
    if g.failed_at is not None:
        failure = [{"at": g.failed_at - origin, "label": _failure_label(g)}]
        layers += _mark_layers(failure, "failure", "#d62728",
                               {"align": "right", "dx": -3, "dy": -16, "fontSize": 11, "fontWeight": "bold"},
                               {"strokeWidth": 2})
    title = "nodes and ranks on one time axis"
    if calls_left_out:
        title += " (the last %d calls marked; %d earlier)" % (len(calls), calls_left_out)
    return {
        "$schema": SCHEMA,
        "title": {"text": title, "fontSize": 12, "anchor": "start"},
        "width": WIDTH_PX,
        "height": max(60, LANE_PX * len(order)),
        "layer": layers,
        "config": {"axisY": {"labelLimit": 240}},
    }


def _mark_layers(values: List[Dict[str, Any]], what: str, colour: str, text: Dict[str, Any],
                 rule: Dict[str, Any]) -> List[Dict[str, Any]]:
    """A vertical rule at each value's ``at`` and its ``label`` above the plot."""
    if not values:
        return []
    x = {"field": "at", "type": "quantitative"}
    return [
        {"data": {"values": values}, "mark": dict({"type": "rule", "color": colour}, **rule),
         "encoding": {"x": x, "tooltip": [{"field": "label", "type": "nominal", "title": what}]}},
        {"data": {"values": values},
         "mark": dict({"type": "text", "y": 0, "baseline": "bottom", "color": colour}, **text),
         "encoding": {"x": x, "text": {"field": "label"}}},
    ]


def captions(g: Gang) -> List[str]:
    """What the chart leaves out, in words, for a line under it."""
    notes = []
    groups = _node_groups(g.num_nodes)
    if len(groups) < g.num_nodes:
        notes.append("nodes are drawn in %d groups of %d" % (len(groups), groups[0][1] - groups[0][0] + 1))
    shown = _rank_nodes(g)
    if len(shown) < len([n for n, count in _lane_counts(g).items() if count]):
        notes.append("ranks of node%s %s only" % ("" if len(shown) == 1 else "s", ", ".join(map(str, shown))))
    notes += _unknown_starts(g)
    return notes


def _unknown_starts(g: Gang) -> List[str]:
    """A replaced start drawn for some nodes only: this node keeps its own and the failing nodes'."""
    starts = sorted({run.start for run in g.runs})
    nodes = sorted({run.node for run in g.runs if run.start == starts[-1]}) if starts else []
    notes = []
    for start in starts[:-1]:
        known = {run.node for run in g.runs if run.start == start}
        missing = [n for n in nodes if n not in known and g.swapped_in.get(n, 0) <= start]
        if missing and known:
            notes.append("start %d is drawn for node%s %s only (a node that did not fail keeps its own on its "
                         "card)" % (start, "" if len(known) == 1 else "s", ", ".join(map(str, sorted(known)))))
    return notes[-2:]
