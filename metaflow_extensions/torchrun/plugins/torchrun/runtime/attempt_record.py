"""The control's record of this attempt, completed at the step's end: every
attempt so far (runtime/attempts.py), this attempt's nodes and their roles
(runtime/node_roles.py) and the goodput ledger (runtime/goodput.py).

All of it from what the control already holds: the gang service's hosts
(each node's hello), the cause, the preflight's record, the calls' results.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence

from ..cause import Cause
from . import attempts as attempts_
from . import goodput
from . import node_roles
from .card import this_card_hash
from .result import TorchrunResult
from .session import GangSession


def nodes(session: GangSession, result: Optional[TorchrunResult], cause: Optional[Cause],
          tasks: Sequence[str]) -> Any:
    """This attempt's nodes with their hosts and roles (a tuple, and the
    count left out above ``node_roles.MAX_NODES``)."""
    hosts: Dict[int, str] = session.server.hosts() if session.server is not None else {}
    job = session.preflight.job
    links = dict(job.link_gbps) if job is not None else {}
    slow = {n: 0.0 for n in (job.slow if job is not None else ())}
    slow.update(node_roles.stragglers(getattr(result, "progress", None)))
    checks: Dict[int, str] = {}
    record = session.server.preflight_record(session.preflight.mode) if (
        session.server is not None and session.preflight.mode) else None
    for finding in (record.findings if record is not None else ()):
        for n in finding.nodes:
            checks[n] = (checks.get(n, "") + " " + finding.check.name).strip()
    blamed = node_roles.blamed_nodes(cause, attempts_.user_code_failure(cause) is not None)
    return node_roles.entries(session.topology.num_nodes, hosts, blamed, slow, links, checks, tasks,
                              taken_out=session.bench.out)


def complete(result: TorchrunResult, session: GangSession, retry_count: int, started: float,
             cause: Optional[Cause], previous: Optional[attempts_.Previous],
             resumed_from: Optional[attempts_.Checkpoint], refused_for: Optional[int],
             code_started: Optional[float], tasks: Sequence[str]) -> TorchrunResult:
    """``result`` with every attempt so far and the ledger."""
    now = time.time()
    entries, left_out = nodes(session, result, cause, tasks)
    entry = attempts_.this_attempt(retry_count, started, session.results, cause, resumed_from, refused_for,
                                   code_started, recorded_at=now, nodes=entries, nodes_left_out=left_out,
                                   card=this_card_hash(),
                                   hosts=session.server.hosts() if session.server is not None else None)
    past: List[attempts_.Attempt] = attempts_.fill_missing(attempts_.history(previous), retry_count)
    result.attempts = attempts_.with_costs(past + [entry])
    result.goodput = goodput.ledger(result.attempts, now)
    return result
