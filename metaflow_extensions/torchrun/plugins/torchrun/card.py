"""The step's card: the distributed run at a glance.

Built from the ``TorchrunResult`` only, with Metaflow's own card components
(Markdown and Table), so it renders offline like every Metaflow card. On the
control node the result holds the whole gang (every node reports its ranks and
their last lines when it finishes); on other nodes, that node.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

from .failures import describe_exit_code
from .result import TorchrunResult

CARD_ID = "torchrun"
BAR_WIDTH = 40


def _fmt_time(t: Optional[float], origin: float) -> str:
    return "" if t is None else "+%.1f s" % (t - origin)


def _fmt_code(code: Optional[int]) -> str:
    if code is None:
        return "unknown"
    return "0 (ok)" if code == 0 else describe_exit_code(code)


def _bar(start: Optional[float], end: Optional[float], origin: float, span: float) -> str:
    """A text bar: the node's life on a common time axis."""
    if start is None or span <= 0:
        return ""
    end = end if end is not None else origin + span
    a = int(round(BAR_WIDTH * (start - origin) / span))
    b = max(a + 1, int(round(BAR_WIDTH * (end - origin) / span)))
    return "·" * a + "█" * (b - a) + "·" * max(0, BAR_WIDTH - b)


def gang_ranks(result: TorchrunResult) -> Dict[int, List[Dict[str, Any]]]:
    """Rank records per node: every node on the control, this node elsewhere."""
    reports = (result.gang or {}).get("reports") or {}
    out = {int(node): list(rep.get("ranks") or []) for node, rep in reports.items()}
    if result.node_index not in out:
        out[result.node_index] = [dict(vars(r)) for r in result.ranks]
    return dict(sorted(out.items()))


def gang_tails(result: TorchrunResult) -> Dict[int, Dict[str, List[str]]]:
    tails: Dict[int, Dict[str, List[str]]] = {}
    for rep in ((result.gang or {}).get("reports") or {}).values():
        for rank, streams in (rep.get("tails") or {}).items():
            tails[int(rank)] = streams
    return dict(sorted(tails.items()))


def summary_markdown(result: TorchrunResult, flow: str, pathspec: str) -> str:
    if result.succeeded:
        status = "**Succeeded** in %.1f s" % result.duration
    else:
        cause = result.cause or {}
        status = "**Failed**: %s" % (cause.get("summary") or _fmt_code(result.exit_code))
    return "# @torchrun: %s\n\n`%s`\n\n%s" % (flow, pathspec, status)


def topology_rows(result: TorchrunResult, backend: str) -> List[List[str]]:
    return [
        ["nodes x processes", "%d x %s" % (result.num_nodes, result.nproc_per_node)],
        ["control address", str(result.main_addr)],
        ["this node's address", str(result.local_addr)],
        ["rendezvous port (c10d)", str(result.rdzv_port)],
        ["gang service port", str(result.gang_port)],
        ["backend", backend],
        ["restarts", str(result.restarts)],
        ["this node", str(result.node_index)],
    ]


def timeline_rows(result: TorchrunResult) -> List[List[str]]:
    gang = result.gang or {}
    joined = {int(k): v for k, v in (gang.get("joined_at") or {}).items()}
    finished = {int(k): v for k, v in (gang.get("finished_at") or {}).items()}
    if not joined:
        joined = {result.node_index: result.started_at}
        finished = {result.node_index: result.ended_at}
    origin = min(joined.values())
    last = max(list(finished.values()) + [result.ended_at])
    span = max(last - origin, 1e-3)
    rows = []
    for node in range(result.num_nodes):
        start, end = joined.get(node), finished.get(node)
        rows.append(
            [
                str(node),
                _fmt_time(start, origin) if start else "never joined",
                _fmt_time(end, origin),
                _bar(start, end, origin, span),
            ]
        )
    return rows


def rank_rows(result: TorchrunResult) -> List[List[str]]:
    rows = []
    for node, ranks in gang_ranks(result).items():
        for r in sorted(ranks, key=lambda r: r.get("rank", 0)):
            start, end = r.get("start"), r.get("end")
            rows.append(
                [
                    str(r.get("rank")),
                    str(node),
                    str(r.get("local_rank")),
                    str(r.get("pid")),
                    _fmt_code(r.get("exit_code")),
                    "%.1f s" % (end - start) if start and end else "",
                ]
            )
    return rows


def build_components(result: TorchrunResult, flow: str, pathspec: str, backend: str) -> list:
    from metaflow.cards import Markdown, Table

    parts = [
        Markdown(summary_markdown(result, flow, pathspec)),
        Markdown("## Topology"),
        Table(topology_rows(result, backend), headers=["", ""]),
        Markdown("## Timeline (nodes, from the first join)"),
        Table(timeline_rows(result), headers=["node", "joined", "finished", "timeline"]),
        Markdown("## Ranks"),
        Table(rank_rows(result), headers=["rank", "node", "local rank", "pid", "exit", "duration"]),
    ]
    cause = result.cause
    if cause:
        text = cause.get("summary") or str(cause)
        parts.append(Markdown("## Root cause\n\n```\n%s\n```" % text))
    tails = gang_tails(result)
    if tails:
        parts.append(Markdown("## Last lines of each rank"))
        for rank, streams in tails.items():
            for stream in ("stdout", "stderr"):
                lines = streams.get(stream) or []
                if lines:
                    lines = [l.replace("```", "'''") for l in lines]
                    parts.append(
                        Markdown("**rank %d %s**\n\n```\n%s\n```" % (rank, stream, "\n".join(lines)))
                    )
    parts.append(Markdown("_Generated %s_" % time.strftime("%Y-%m-%d %H:%M:%S")))
    return parts


# -- Metaflow card glue: the decorator's hooks call these --------------------


def attach_card(decorators) -> Optional[Any]:
    """Add ``@card(type="blank", id="torchrun")`` to the step unless present."""
    try:
        from metaflow.plugins.cards.card_decorator import CardDecorator
    except ImportError:
        return None
    for deco in decorators:
        if isinstance(deco, CardDecorator) and deco.attributes.get("id") == CARD_ID:
            return deco
    deco = CardDecorator(attributes={"type": "blank", "id": CARD_ID})
    if hasattr(deco, "external_init"):  # Metaflow 2.16+; before, __init__ did it all
        deco.external_init()
    # Metaflow is iterating this very list to call step_init: the card's own
    # step_init runs right after ours.
    decorators.append(deco)
    return deco


def fill_card(result: TorchrunResult, flow_name: str) -> None:
    import os
    import sys

    from metaflow import current

    try:
        card = current.card[CARD_ID]
        card.clear()
        cuda = any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0"))
        backend = "nccl" if cuda else "gloo (no CUDA device on the node)"
        card.extend(build_components(result, flow_name, current.pathspec, backend))
    except Exception as e:  # a card must never fail the step
        print("@torchrun: could not build the card: %s" % e, file=sys.stderr)


def render_card_now(deco) -> None:
    """Metaflow renders cards of successful tasks only; the card of a failed
    run is the one that matters most."""
    import sys

    try:
        deco.card_creator.create(
            mode="render",
            final=True,
            card_uuid=deco._card_uuid,
            user_set_card_id=deco._user_set_card_id,
            runtime_card=deco._is_runtime_card,
            decorator_attributes=deco.attributes,
            card_options=deco.card_options,
            logger=deco._logger,
            sync=True,
        )
    except Exception as e:
        print("@torchrun: could not render the card of the failed task: %s" % e, file=sys.stderr)
