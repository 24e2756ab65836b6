"""Every start of a call's ranks, as the card draws them: the first, and one more after each in-step
restart or swap. A start a restart replaced has its failed rank (the restart's cause) and its
bystanders, stopped by the restart; the last start is the call's. Pure: a ``TorchrunResult`` in.

Where a replaced start's ranks come from: the control keeps those of the nodes that reported its
failure (``GangView.replaced``), each node those of its own (``InStepRestart.ranks``), and a node
taken out by a swap left its last report, of the start it failed in. A rank record says its start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..procs.failures import describe_exit_code

# Exits that mean "stopped from outside" (the agent's SIGTERM, SIGKILL after its grace).
STOPPED_EXITS = (-15, -9)


@dataclass(frozen=True)
class RankRun:
    """One rank in one start of the ranks, on one node."""

    node: int
    start: int  # 0: the first start; k: after restart k
    record: Any  # its RankStatus
    state: str  # the timeline's: "rank: exit 0", "rank: failed", "rank: stopped", "rank: no exit"
    end: Optional[float]  # its end, else (a replaced start) when its restart stopped it

    @property
    def rank(self) -> int:
        return self.record.rank


def _index(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def last_start(result: Any) -> int:
    """The start the call ended in: its restarts used."""
    return max([_index(result.restarts) or 0] + [_index(r.restart) or 0 for r in result.in_step_restarts or ()])


def final_ranks(result: Any) -> Dict[int, List[Any]]:
    """Rank records per node as the call ended: every node's report on the control, this node elsewhere."""
    out = {node: list(report.ranks) for node, report in result.gang.reports.items()}
    if result.node_index not in out:
        out[result.node_index] = [r.for_wire() for r in result.ranks]
    return dict(sorted(out.items()))


def restart_of(result: Any, start: int) -> Optional[Any]:
    """The in-step restart that replaced ``start`` (restart ``start + 1``), where this node has it."""
    return next((r for r in result.in_step_restarts or () if r.restart == start + 1), None)


def failed_in(result: Any, start: int) -> Tuple[Optional[int], Optional[int]]:
    """(node, rank) of the failure that ended ``start``: a restart's cause, else the call's."""
    restart = restart_of(result, start)
    cause = restart.cause if restart is not None else (result.cause if start == last_start(result) else None)
    if cause is None:
        return None, None
    return _index(cause.node_index), _index(cause.rank)


def _sources(result: Any, final: Mapping[int, Sequence[Any]]) -> Iterable[Tuple[int, int, Any]]:
    """(node, start, record) from every place a start's ranks are kept, the best known first."""
    for node, ranks in final.items():
        for r in ranks:
            yield node, _index(r.restart) or 0, r
    for start, nodes in sorted((getattr(result.gang, "replaced", None) or {}).items()):
        for node, ranks in sorted(nodes.items()):
            for r in ranks:
                yield node, start, r
    for restart in result.in_step_restarts or ():
        for r in restart.ranks:
            yield result.node_index, restart.restart - 1, r


def rank_runs(result: Any, final: Optional[Mapping[int, Sequence[Any]]] = None) -> List[RankRun]:
    """Every rank of every start known here (``final``: the rank records per node as the call ended, else
    ``final_ranks``), by (start, node, rank); a record with an exit is kept over one without."""
    found: Dict[Tuple[int, int, int], Any] = {}
    for node, start, r in _sources(result, final_ranks(result) if final is None else final):
        rank = _index(r.rank)
        if rank is None:
            continue
        key = (start, node, rank)
        if key not in found or (found[key].exit_code is None and r.exit_code is not None):
            found[key] = r
    last = last_start(result)
    runs = []
    for (start, node, _rank), r in sorted(found.items()):
        runs.append(RankRun(node, start, r, state_in_start(r, node, failed_in(result, start), start < last),
                            _end(result, r, start, last)))
    return runs


def _end(result: Any, r: Any, start: int, last: int) -> Optional[float]:
    end = _number(r.end)
    if end is not None or start >= last:
        return end
    restart = restart_of(result, start)
    if restart is None:
        return None
    return _number(restart.stopped_at) or _number(restart.failed_at)


def state_in_start(r: Any, node: int, failed: Tuple[Optional[int], Optional[int]], replaced: bool) -> str:
    """The failed rank of a start in a colour of its own; a replaced start's others were stopped by its
    restart (whatever exit they made of it: an echo, a signal, none yet)."""
    code = r.exit_code
    failed_node, failed_rank = failed
    exited = isinstance(code, int) and not isinstance(code, bool)
    if node == failed_node and (r.rank == failed_rank or (failed_rank is None and exited and code != 0
                                                          and code not in STOPPED_EXITS)):
        return "rank: failed"
    if exited and code == 0:
        return "rank: exit 0"
    if replaced:
        return "rank: stopped"
    if not exited:
        return "rank: no exit"
    return "rank: stopped" if code in STOPPED_EXITS else "rank: failed"


def restarted(runs: Sequence[RankRun]) -> bool:
    """Whether more than one start is drawn."""
    return len({run.start for run in runs}) > 1


def exit_words(run: RankRun, last: int) -> str:
    """A rank's exit for the Ranks table; a replaced start's bystander says what stopped it."""
    code = run.record.exit_code
    if run.start < last and run.state == "rank: stopped":
        if code is None:
            return "stopped by restart %d (no exit recorded)" % (run.start + 1)
        return "%s (a bystander of restart %d's failure)" % (describe_exit_code(code), run.start + 1)
    if code is None:
        return "unknown"
    return "0 (ok)" if code == 0 else describe_exit_code(code)


def start_words(start: int, last: int) -> str:
    """``0 (replaced by restart 1)``, ``1 (the last)``."""
    if start < last:
        return "%d (replaced by restart %d)" % (start, start + 1)
    return "%d (the last)" % start if last else "0"


def report_starts(result: Any) -> Mapping[Tuple[int, int], int]:
    """(node, rank) -> the start of that node's last report of the rank: where its last lines end."""
    return {(node, r.rank): _index(r.restart) or 0 for node, ranks in final_ranks(result).items() for r in ranks}
