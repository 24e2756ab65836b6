"""The card's training progress (step, ETA, steps/s, metrics, the slowest node, stragglers, steps/s
per node over time), from the bounded record alone, so the live card and the final one agree.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from .. import load_order  # noqa: F401  (Metaflow first, whatever the user imports first)
from metaflow.cards import Markdown, Table

from ..gang import ProgressRecord, gang_progress
from .text import clip, escape_markdown
from .timeline import SCHEMA, WIDTH_PX

CHART_HEIGHT_PX = 220


def rows(progress: ProgressRecord, cell: Callable[[Any], str] = clip) -> List[List[str]]:
    """One row a fact. A rank's text (a metric's name) is only clipped (``cell``): a cell is drawn as
    text, where an escape would show as typed."""
    out: List[List[str]] = []
    if progress.step is not None:
        step = "%d" % progress.step
        if progress.total:
            step += " of %d (%.0f%%)" % (progress.total, progress.percent or 0)
        out.append(["step", step])
    if progress.eta_seconds is not None:
        out.append(["ETA", gang_progress.duration(progress.eta_seconds)])
    elif progress.measuring and progress.total:
        out.append(["ETA", "measuring..."])
    if progress.steps_per_second is not None:
        out.append(["steps/s", "%.3g (median node)" % progress.steps_per_second])
    elif progress.measuring:
        out.append(["steps/s", "measuring..."])
    out += [[cell(name), "%.6g" % value] for name, value in progress.metrics.items()]
    if progress.slowest is not None and progress.nodes_reporting > 1:
        s = progress.slowest
        out.append(["slowest node", "node %d (%s, ranks %s): %.2fx the median steps/s" % (
            s["node_index"], cell(s["host"]), s["ranks"], s["ratio"])])
    if progress.signal is not None:
        out.append(["straggler signal", progress.signal])
    return out


def parts(progress: Optional[ProgressRecord]) -> list:
    """Nothing when no rank reported progress and no straggler was named."""
    if progress is None or (progress.step is None and not progress.stragglers):
        return []
    out = [Markdown("## Progress")]
    table = rows(progress)
    if table:
        out.append(Table(table, headers=["", ""]))
    if progress.stragglers:
        named = ["- %s" % escape_markdown(s.sentence()) for s in progress.stragglers]
        if progress.stragglers_more:
            named.append("- and %d more nodes" % progress.stragglers_more)
        out.append(Markdown("**Stragglers**\n\n" + "\n".join(named)))
    if progress.chart:
        try:
            from metaflow.cards import VegaChart
        except ImportError:
            return out
        out.append(VegaChart(chart_spec(progress)))
    return out


def chart_spec(progress: ProgressRecord) -> Dict[str, Any]:
    """A line of steps/s per group of nodes. A row per sample, a column per group, folded by Vega-Lite:
    no group's name per point (the card of 1,024 nodes stays under 2 MB)."""
    labels = [label.replace("nodes ", "").replace("node ", "") for label in progress.chart_groups]
    values = [dict({"t": t}, **{labels[g]: float("%.3g" % r) for g, r in enumerate(rates)
                                if r is not None and g < len(labels)}) for t, rates in progress.chart]
    return {
        "$schema": SCHEMA,
        "width": WIDTH_PX,
        "height": CHART_HEIGHT_PX,
        "title": "steps/s per node over time",
        "data": {"values": values},
        "transform": [{"fold": labels, "as": ["nodes", "rate"]}, {"filter": "isValid(datum.rate)"}],
        "mark": {"type": "line", "point": False},
        "encoding": {
            "x": {"field": "t", "type": "quantitative", "title": "seconds since the first report"},
            "y": {"field": "rate", "type": "quantitative", "title": "steps/s"},
            "color": {"field": "nodes", "type": "nominal", "title": "nodes", "legend": {"columns": 2}},
            "tooltip": [{"field": "nodes"}, {"field": "t"}, {"field": "rate"}],
        },
    }

