"""The control's record of this attempt, completed at the step's end: every
attempt so far (record/attempts.py), this attempt's nodes and their roles
(record/node_roles.py) and the goodput ledger (record/goodput.py).

All of it from what the control already holds, handed in as one ``AttemptFacts``
(read off the session by ``runtime/step_run.attempt_facts``): the gang service's
hosts (each node's hello), the cause, the preflight's record, the calls'
results. So the record builds with no process and no socket.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..cause import Cause
from ..gang import JobRecord, PreflightRecord
from . import attempts as attempts_
from . import goodput
from . import node_roles
from .result import TorchrunResult


@dataclass(frozen=True)
class AttemptFacts:
    """What the step's record needs of its gang as the task ends: plain values."""

    is_control: bool
    node_index: int
    num_nodes: int
    results: Tuple[TorchrunResult, ...] = ()  # every call's, in order
    cause: Optional[Cause] = None  # why the gang stopped, if it did
    refusal: Optional[TorchrunResult] = None  # the control's record of a gang refused before any call
    preflight: Optional[PreflightRecord] = None  # the control's, with its job
    job: Optional[JobRecord] = None  # the preflight's collective job, if it ran
    hosts: Optional[Dict[int, str]] = None  # each node's host (the control's service); None without one
    taken_out: Tuple[int, ...] = ()  # the nodes benched out for a spare
    card: Optional[str] = None  # this attempt's card's hash

    @property
    def last_result(self) -> Optional[TorchrunResult]:
        return self.results[-1] if self.results else None


def nodes(facts: AttemptFacts, result: Optional[TorchrunResult], cause: Optional[Cause],
          tasks: Sequence[str]) -> Tuple[Tuple[node_roles.NodeEntry, ...], int]:
    """This attempt's nodes with their hosts and roles (a tuple, and the
    count left out above ``node_roles.MAX_NODES``)."""
    job = facts.job
    links = dict(job.link_gbps) if job is not None else {}
    slow = {n: 0.0 for n in (job.slow if job is not None else ())}
    slow.update(node_roles.stragglers(getattr(result, "progress", None)))
    checks: Dict[int, str] = {}
    for finding in (facts.preflight.findings if facts.preflight is not None else ()):
        for n in finding.nodes:
            checks[n] = (checks.get(n, "") + " " + finding.check.name).strip()
    blamed = node_roles.blamed_nodes(cause, attempts_.user_code_failure(cause) is not None)
    return node_roles.entries(facts.num_nodes, facts.hosts or {}, blamed, slow, links, checks, tasks,
                              taken_out=facts.taken_out)


def complete(result: TorchrunResult, facts: AttemptFacts, retry_count: int, started: float,
             cause: Optional[Cause], previous: Optional[attempts_.Previous],
             resumed_from: Optional[attempts_.Checkpoint], refused_for: Optional[int],
             code_started: Optional[float], tasks: Sequence[str]) -> TorchrunResult:
    """``result`` with every attempt so far and the ledger."""
    now = time.time()
    entries, left_out = nodes(facts, result, cause, tasks)
    entry = attempts_.this_attempt(retry_count, started, list(facts.results), cause, resumed_from, refused_for,
                                   code_started, recorded_at=now, nodes=entries, nodes_left_out=left_out,
                                   card=facts.card, hosts=facts.hosts)
    past: List[attempts_.Attempt] = attempts_.fill_missing(attempts_.history(previous), retry_count)
    result.attempts = attempts_.with_costs(past + [entry])
    result.goodput = goodput.ledger(result.attempts, now)
    return result
