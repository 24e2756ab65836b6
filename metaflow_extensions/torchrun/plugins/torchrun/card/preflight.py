"""The card's "Preflight" section: nodes by checks, the findings with their fixes, and
(``preflight="full"``) each node's bandwidth; from the bounded record alone."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .. import load_order  # noqa: F401  (Metaflow first, whatever the user imports first)
from metaflow.cards import Markdown, Table

from ..gang import JobRecord, PreflightRecord
from ..gang.node_compare import describe_job
from .text import code_block, escape_markdown


def table(record: PreflightRecord) -> List[List[str]]:
    rows = record.rows
    names = list(dict.fromkeys(k for row in rows for k in row if k != "node"))
    out = [["node"] + names] + [[str(row.get("node"))] + [str(row.get(name, "")) for name in names] for row in rows]
    shown, total = len(rows), record.reported
    if total > shown:
        out.append(["...", "%d more nodes, every check ok" % (total - shown)] + [""] * (len(names) - 1))
    return out


def findings_markdown(record: PreflightRecord) -> str:
    lines = ["- versions differ: %s" % escape_markdown(text) for text in record.differences]
    for f in record.findings:
        check = f.check
        nodes = ", ".join(str(n) for n in f.nodes)
        more = f.count - len(f.nodes)
        lines.append("- **%s** %s on node%s %s%s: found %s, expected %s. %s" % (
            escape_markdown(check.name), escape_markdown(check.status), "s" if f.count != 1 else "", nodes,
            " and %d more" % more if more > 0 else "", escape_markdown(check.found),
            escape_markdown(check.expected or "-"), ("Fix: " + escape_markdown(check.fix)) if check.fix else ""))
    return "\n".join(lines)


def bandwidth_spec(job: JobRecord) -> Dict[str, Any]:
    """A Vega-Lite bar chart: GB/s from each node to the reference node."""
    slow = set(job.slow)
    values = [{"node": str(n), "GB/s": v, "slow": n in slow} for n, v in sorted(job.link_gbps.items())]
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "width": min(600, 40 + 12 * len(values)), "height": 120,
        "data": {"values": values},
        "mark": "bar",
        "encoding": {
            "x": {"field": "node", "type": "ordinal", "sort": None},
            "y": {"field": "GB/s", "type": "quantitative"},
            "color": {"field": "slow", "type": "nominal",
                      "scale": {"domain": [False, True], "range": ["#4c78a8", "#e45756"]}},
        },
    }


def parts(record: Optional[PreflightRecord]) -> list:
    if record is None:
        return []
    out: list = [Markdown("## Preflight (%s)" % escape_markdown(record.mode))]
    if record.rows:
        rows = table(record)
        out.append(Table(rows[1:], headers=rows[0]))
    text = findings_markdown(record)
    out.append(Markdown(text or "Every node runs the same software and passed every check."))
    job = record.job
    if job is not None:
        out.append(Markdown(code_block("\n".join(describe_job(job)))))
        if job.link_gbps:
            try:
                from metaflow.cards import VegaChart

                out.append(Markdown("GB/s from each node to node %s (a round trip of %s MiB):" % (
                    job.home_node, job.size_mib)))
                out.append(VegaChart(bandwidth_spec(job)))
            except ImportError:  # an older Metaflow: the table says it
                pass
        init, links = job.init_s, job.link_gbps
        nodes = sorted(set(init) | set(links))[:64]
        out.append(Table([[str(n), "%.3f" % init[n] if n in init else "",
                           "%.3f" % links[n] if n in links else "reference"] for n in nodes],
                         headers=["node", "process-group init (s)", "GB/s to node %s" % job.home_node]))
    return out
