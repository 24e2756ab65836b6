"""A call's end on this node (``CallEnd``: what its ranks returned, or the error it raises) and its
``TorchrunResult``, built once whatever happened: returned, or handed to the error as it is made
(``err.result``), and kept by the session for the task's record and card.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from ..gang.client import GangClient
from ..launch import CallPlan
from ..procs.failures import RankFailure
from ..record import what_ran
from ..record.in_step_restarts import with_ranks_start
from ..record.gang_view import GangView
from ..record.result import TorchrunResult, read_rank_records
from .call_launch import NodeLaunch, RanksStart
from .call_stacks import CallStacks
from .ranks_run import RanksRun
from .restarts import CallRestarts
from .session import GangSession

# The error a failed call raises, made once its result is known (the result rides on it).
ErrorWith = Callable[[TorchrunResult], BaseException]


@dataclass(frozen=True)
class CallEnd:
    """How the call ended on this node: rank by rank what a function returned (rank 0's on the
    control, once every node was done), and the error to raise, None where it ended well."""

    returns: Dict[int, object] = field(default_factory=dict)
    error: Optional[ErrorWith] = None


@dataclass(frozen=True)
class CallParts:
    """What the result is read from: the call's collaborators, as they stand when it ends."""

    session: GangSession
    plan: CallPlan
    index: int
    began: float  # epoch: the call entered on this node
    launch: NodeLaunch
    ranks: RanksRun
    restarts: CallRestarts
    stacks: CallStacks


def call_result(parts: CallParts, start: Optional[RanksStart], rdzv_port: Optional[int],
                exit_code: Optional[int], end: CallEnd,
                failures: List[RankFailure]) -> TorchrunResult:
    """The call's record, from ``start`` (the last start of the ranks, None where none was made) and
    the call's ``rdzv_port`` (None where the gang stopped before it said one)."""
    session, ranks, launch = parts.session, parts.ranks, parts.launch
    topology, client = session.context.topology, session.client
    records = read_rank_records(launch.workdir, failures) if launch.workdir else []
    seat = start.seat if start is not None else None
    argv = list(start.argv) if start is not None else []
    stacks = parts.stacks
    return TorchrunResult(
        command=argv, call=parts.index, exit_code=exit_code, returns=dict(end.returns), ranks=records,
        node_index=topology.node_index, num_nodes=topology.num_nodes, nproc_per_node=parts.plan.nproc,
        started_at=ranks.first_started or ranks.started_at or parts.began,
        ended_at=ranks.ended_at or time.time(),
        first_output_at=ranks.first_output_at,
        main_addr=topology.main_addr, local_addr=launch.local_addr,
        rdzv_port=rdzv_port,
        gang_port=client.port if client else None,
        restarts=max([r.restart or 0 for r in records] + [parts.restarts.restart]),
        restarts_allowed=session.context.defaults.restarts,
        in_step_restarts=with_ranks_start(parts.restarts.records, launch.rank_starts(parts.restarts.restart)),
        log_dir=launch.log_dir, cause=session.cause, gang=gang_view(client, parts.index),
        stacks=dict(stacks.stacks), stack_seconds=round(stacks.seconds, 3), culprits=stacks.culprits,
        flight_unread=stacks.flight_unread,
        ran=what_ran.record(parts.plan, argv, launch.log_dir, topology.node_index),
        progress=client.progress_record() if client is not None else None,
        role=seat.role if seat else "active", spare_nodes=list(seat.bench.spares) if seat else [],
        out_nodes=list(seat.bench.out) if seat else [],
    )


def gang_view(client: Optional[GangClient], index: int) -> GangView:
    """When each node joined and finished the call, and what each reported (the control's)."""
    if client is None:
        return GangView()
    view = client.call_view(index)
    return GangView(dict(view.joined_at), dict(view.finished_at), dict(view.reports), dict(view.replaced))
