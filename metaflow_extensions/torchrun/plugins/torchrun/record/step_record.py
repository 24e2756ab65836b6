"""The step's record as the task ends, built here alone (``step_result``) from the
attempt's facts (``AttemptFacts``, read off the session by the runtime) and the
``ThisAttempt`` the decorator kept.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from ..cause import Cause, CauseKind
from ..gang import JobRecord, PreflightRecord
from ..host.console import say
from . import attempts as attempts_
from . import evidence, goodput, node_roles
from .result import METADATA_FIELD, REPORT_ARTIFACT, TorchrunResult

# Every artifact a task of a @torchrun step keeps: the control's report and
# goodput ledger, a failed attempt's evidence (the control's, the named node's).
# A join's ``merge_artifacts`` compares what its inputs hold under one name:
# of a successful step only the control holds any, and no node holds another
# step's (passed down by an earlier join: ``drop_inherited``).
ARTIFACTS = (REPORT_ARTIFACT, evidence.ARTIFACT, goodput.ARTIFACT)


@dataclass(frozen=True)
class AttemptFacts:
    """What the step's record needs of its gang as the task ends: plain values."""

    is_control: bool
    node_index: int
    num_nodes: int
    results: Tuple[TorchrunResult, ...] = ()  # every call's, in order
    cause: Optional[Cause] = None  # why the gang stopped, if it did
    preflight: Optional[PreflightRecord] = None  # the gang service's (the control's), without its job
    job: Optional[JobRecord] = None  # the preflight's collective job, if it ran
    hosts: Optional[Dict[int, str]] = None  # each node's host (the control's service); None without one
    taken_out: Tuple[int, ...] = ()  # the nodes benched out for a spare
    card: Optional[str] = None  # this attempt's card's hash
    nproc: int = 1  # this node's processes as known before any call
    main_addr: str = ""
    tasks: Tuple[str, ...] = ()  # every node's task, as Metaflow lists them on the control
    not_back: Tuple[int, ...] = ()  # the nodes lost that the gang went on without, not back as it ended


@dataclass
class ThisAttempt:
    """What the task knows of its own attempt, beyond the gang's calls."""

    number: int
    retries: int = 0  # the step's @retry(times): the last attempt's number
    started: float = field(default_factory=time.time)
    previous: Optional[attempts_.Previous] = None  # attempt k-1's record (the control, k > 0)
    refusal: Optional[str] = None  # retry_on refused this attempt: why
    resumed_from: Optional[attempts_.Checkpoint] = None  # @checkpoint's load, as the code starts
    code_started: Optional[float] = None

    def code_starts(self, resumed_from: Optional[attempts_.Checkpoint]) -> None:
        """The step's code starts now, after ``@checkpoint`` loaded ``resumed_from`` (if anything)."""
        self.resumed_from, self.code_started = resumed_from, time.time()

    def read_previous(self, pathspec: str, retry_on: str) -> Optional[str]:
        """Attempt k-1's record, and whether to run this one; returns a line to say, if any."""
        self.previous, note = attempts_.read_previous(pathspec, self.number - 1, METADATA_FIELD)
        self.refusal = attempts_.refusal(retry_on, self.number, self.previous, self.retries)
        return note


def step_result(facts: Optional[AttemptFacts], attempt: ThisAttempt) -> Optional[TorchrunResult]:
    """The record to keep for this task, None when it has none (no gang)."""
    if facts is None:
        return None
    result = facts.results[-1] if facts.results else None
    if facts.is_control:
        result = with_attempts(facts, result, attempt)
    if result is None:
        return None
    if facts.preflight is not None:
        result.preflight = replace(facts.preflight, job=facts.job)
    return result


def with_attempts(facts: AttemptFacts, result: Optional[TorchrunResult], attempt: ThisAttempt) -> TorchrunResult:
    """The control's record, with every attempt so far and the ledger. An attempt that made no call
    (refused, or its gang stopped first) gets a record too: the next attempt reads why it stopped."""
    refused_for = None
    if attempt.refusal is not None and attempt.previous is not None:
        cause = attempt.previous.cause  # carried: the next attempt refuses too
        refused_for = attempts_.previous_origin(attempt.previous, attempt.number - 1)
    else:
        cause = (result.cause if result is not None else None) or facts.cause
    if result is None:
        result = no_call(facts, attempt.started)
    result.cause = cause
    now = time.time()
    entries, left_out = nodes(facts, result, cause, facts.tasks)
    entry = attempts_.this_attempt(attempt.number, attempt.started, list(facts.results), cause,
                                   attempt.resumed_from, refused_for, attempt.code_started, recorded_at=now,
                                   nodes=entries, nodes_left_out=left_out, card=facts.card, hosts=facts.hosts,
                                   not_back=facts.not_back)
    result.attempts = attempts_.with_costs(attempts_.fill_missing(attempt.previous, attempt.number) + [entry])
    result.goodput = goodput.ledger(result.attempts, now)
    return result


def no_call(facts: AttemptFacts, started: float) -> TorchrunResult:
    """The control's record of an attempt that made no call (a preflight's refusal: its call 0)."""
    now = time.time()
    refused = facts.cause is not None and facts.cause.kind is CauseKind.PREFLIGHT
    return TorchrunResult(command=[], node_index=facts.node_index, num_nodes=facts.num_nodes,
                          nproc_per_node=facts.nproc if refused else "", exit_code=None,
                          started_at=now if refused else started, ended_at=now,
                          main_addr=facts.main_addr if refused else "", call=0 if refused else -1)


def nodes(facts: AttemptFacts, result: TorchrunResult, cause: Optional[Cause],
          tasks: Sequence[str]) -> Tuple[Tuple[node_roles.NodeEntry, ...], int]:
    """This attempt's nodes with their hosts and roles, and the count left out."""
    job = facts.job
    links = dict(job.link_gbps) if job is not None else {}
    slow = {n: 0.0 for n in (job.slow if job is not None else ())}
    slow.update(node_roles.stragglers(result.progress))
    checks: Dict[int, str] = {}
    for finding in (facts.preflight.findings if facts.preflight is not None else ()):
        for n in finding.nodes:
            checks[n] = (checks.get(n, "") + " " + finding.check.name).strip()
    blamed = node_roles.blamed_nodes(cause, attempts_.user_code_failure(cause) is not None)
    return node_roles.entries(facts.num_nodes, facts.hosts or {}, blamed, slow, links, checks, tasks,
                              taken_out=facts.taken_out)


def keep_record(flow: Any, facts: Optional[AttemptFacts], attempt: ThisAttempt,
                where: Tuple[Any, Any, str, Any], flow_name: str,
                render_card: Callable[[TorchrunResult], bool]) -> bool:
    """The record as task metadata (bounded); as artifacts the full report where that leaves any out,
    a failed attempt's evidence and the ledger. ``where``: the metadata provider and the task's ids.
    True when the card was drawn."""
    drop_inherited(flow)
    result = step_result(facts, attempt)
    if result is None or facts is None:
        return False
    metadata, run_id, step_name, task_id = where
    stored = result.stored("artifact %s of %s/%s/%s/%s" % (REPORT_ARTIFACT, flow_name, run_id, step_name, task_id))
    record = stored.text
    if facts.is_control and (result.stacks or stored.compacted):
        setattr(flow, REPORT_ARTIFACT, [r.to_dict() for r in facts.results])
    bundle = evidence.bundle(result, facts.is_control, facts.node_index, attempt.number, os.environ)
    if bundle is not None:
        setattr(flow, evidence.ARTIFACT, bundle)
    rendered = render_card(result)
    fields = [(METADATA_FIELD, record)]
    if facts.is_control and result.goodput is not None:
        ledger = result.goodput.to_wire()
        setattr(flow, goodput.ARTIFACT, ledger)
        fields.append((goodput.METADATA_FIELD, json.dumps(ledger)))
    try:  # each entry tagged with its attempt, as Metaflow tags its own
        MetaDatum = meta_datum()
        metadata.register_metadata(run_id, step_name, task_id, [
            MetaDatum(field=name, value=value, type=name, tags=["attempt_id:%d" % attempt.number])
            for name, value in fields])
    except Exception as e:  # the record must never fail the step
        say("could not store the run's record: %s" % e)
    return rendered


def drop_inherited(flow: Any) -> None:
    """Pass on none of ``ARTIFACTS`` inherited from an earlier step: a second step's worker carried the
    first's merged ledger, and the join's ``merge_artifacts`` failed (issue 52). Metaflow's ``persist``
    copies the input datastore's table, so the names leave that table and the flow's cached copies."""
    own = getattr(flow, "__dict__", {})
    inherited = own.get("_datastore")
    for name in ARTIFACTS:
        own.pop(name, None)
        for table in (getattr(inherited, "_objects", None), getattr(inherited, "_info", None)):
            if isinstance(table, dict):
                table.pop(name, None)


def meta_datum() -> Any:
    """Metaflow's ``MetaDatum`` (``metaflow.metadata`` before 2.12.x renamed it)."""
    try:
        from metaflow.metadata_provider import MetaDatum
    except ImportError:
        from metaflow.metadata import MetaDatum
    return MetaDatum

