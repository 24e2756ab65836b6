"""Every attempt of a step, and whether the next one is worth running.

Metaflow's ``@retry`` reruns the whole gang whatever stopped it, and a
``TypeError`` in the training loop raises again at the same place: under
``@torchrun(retry_on="infrastructure")`` attempt k reads why attempt k-1
stopped and starts no rank when that was the user's own code. Pure, except
``read_previous``, which asks the Metaflow client.
"""

from __future__ import annotations

import datetime
import itertools
import json
import math
from dataclasses import dataclass, replace
from typing import Annotated, Any, Dict, List, Mapping, Optional, Tuple

from .. import load_order  # noqa: F401  (Metaflow first, whatever the user imports first)
from metaflow import Task

from ..cause import Cause, CauseKind, user_code_failure
from ..base.codec import SKIP, Int, Items, Lenient, Text, Via, encode
from .node_roles import MAX_HOST, NodeEntry
from .in_step_restarts import swap_words

# A record read back holds at most this many attempts, each this many calls.
MAX_ATTEMPTS = 64
MAX_CALLS = 1024
MAX_NODES = 4096
# An attempt keeps its latest in-step restarts (swaps among them), at most.
MAX_RESTART_MARKS = 32

Whole = Annotated[int, Int(0, (1 << 31) - 1)]
# A peer's cause, read as cause.py reads it (a bad one: none).
CAUSE = Via(Cause.from_wire)


@dataclass(frozen=True)
class Previous(Lenient):
    """What attempt k reads of attempt k-1's record: a peer's words, checked."""

    cause: Annotated[Optional[Cause], CAUSE] = None
    attempts: Annotated[Tuple["Attempt", ...], Items(MAX_ATTEMPTS)] = ()


def refusal(retry_on: str, attempt: int, previous: Optional[Previous], retries: int = 0) -> Optional[str]:
    """Why attempt ``attempt`` runs nothing (its error's text), or None to run it. The first refused attempt
    also says, once, that Metaflow's later retries (``retries``) start and end the same way."""
    if retry_on != "infrastructure" or attempt <= 0 or previous is None:
        return None
    what = user_code_failure(previous.cause)
    if what is None:
        return None
    origin = previous_origin(previous, attempt - 1)
    text = ("attempt %d ran nothing: attempt %d failed in your code, %s, and @torchrun(retry_on='infrastructure') "
            "retries only infrastructure failures." % (attempt, origin, what))
    if attempt == origin + 1 and attempt < retries:
        later = "attempt %d, which ends" % retries if attempt + 1 == retries else \
            "attempts %d-%d, each of which ends" % (attempt + 1, retries)
        text += (" Metaflow's @retry still starts %s here the same way before any rank starts (a step cannot "
                 "cancel Metaflow's retries)." % later)
    return text


def previous_origin(previous: Previous, default: int) -> int:
    """The attempt whose failure a refused attempt carried forward."""
    if previous.attempts and previous.attempts[-1].refused_for is not None:
        return previous.attempts[-1].refused_for
    return default


def fill_missing(previous: Optional[Previous], attempt: int) -> List["Attempt"]:
    """Attempts 0..attempt-1, each once: one whose task left no record named unknown."""
    by_attempt = {a.attempt: a for a in (previous.attempts if previous is not None else ())}
    return [by_attempt.get(k) or Attempt(k, stopped="unknown: its control task left no record "
                                           "(killed before the end of its step?)") for k in range(attempt)]


def _metadata(meta: Any) -> Dict[str, Any]:
    """@checkpoint's own metadata, as it wrote it: its first 64 keys, each cut."""
    if not isinstance(meta, Mapping):
        raise ValueError("not an object")
    return {str(k)[:200]: v for k, v in itertools.islice(meta.items(), 64)}


@dataclass(frozen=True)
class Checkpoint(Lenient):
    """The checkpoint ``@checkpoint`` loaded for an attempt."""

    key: Annotated[str, Text(1000)] = ""
    pathspec: Annotated[Optional[str], Text(4000)] = None
    attempt: Optional[Whole] = None
    created_on: Annotated[Optional[str], Text(4000)] = None
    created_at: Optional[float] = None
    metadata: Annotated[Optional[Dict[str, Any]], Via(_metadata)] = None


def checkpoint_info(current: Any) -> Optional[Checkpoint]:
    ckpt = getattr(current, "checkpoint", None) if current is not None else None
    try:
        if ckpt is None or not ckpt.is_loaded:
            return None
        info = ckpt.info
        meta, created_on = getattr(info, "metadata", None), getattr(info, "created_on", None)
        return Checkpoint(str(getattr(info, "key", "")), getattr(info, "pathspec", None),
                          getattr(info, "attempt", None), created_on, _epoch(created_on),
                          dict(meta) if isinstance(meta, Mapping) else None)
    except Exception:  # a checkpoint package we do not know: no resume shown
        return None


def _epoch(stamp: Any) -> Optional[float]:
    try:
        return datetime.datetime.fromisoformat(stamp).timestamp() if isinstance(stamp, str) else None
    except ValueError:
        return None


@dataclass(frozen=True)
class CallStart(Lenient):
    call: Whole
    started_at: float


@dataclass(frozen=True)
class RestartMark(Lenient):
    """An in-step restart or swap of an attempt, at the goodput ledger's marks, with the hosts swapped."""

    call: Whole
    restart: Whole
    failed_at: float
    stopped: Annotated[str, Text(400)] = ""  # the cause's summary
    kind: Optional[CauseKind] = None
    stopped_at: Optional[float] = None
    back_at: Optional[float] = None
    work_from: Optional[float] = None
    swapped_out: Optional[Whole] = None
    swapped_in: Optional[Whole] = None
    out_host: Annotated[Optional[str], Text(MAX_HOST)] = None
    in_host: Annotated[Optional[str], Text(MAX_HOST)] = None
    # Resumed from a snapshot in memory (or, by the ranks' progress, from your checkpoint): the work up to
    # ``kept_until`` (when the step resumed at was done) was kept.
    resumed_step: Annotated[Optional[int], Int(0, (1 << 53) - 1), SKIP] = None
    steps_lost: Annotated[Optional[int], Int(0, (1 << 53) - 1), SKIP] = None
    kept_until: Annotated[Optional[float], SKIP] = None
    # Its new ranks' first snapshot: before it they were starting (the ledger's restart), after it training.
    trained_at: Annotated[Optional[float], SKIP] = None

    @property
    def swap(self) -> Optional[str]:
        """``node 1 (host) out, spare node 2 (host) in``; None for a restart in place."""
        if self.swapped_out is None or self.swapped_in is None:
            return None
        hosts = {self.swapped_out: self.out_host or "?", self.swapped_in: self.in_host or "?"}
        return swap_words(self.swapped_out, self.swapped_in, hosts)

    @property
    def label(self) -> str:
        """What the ledger's segment says stopped it."""
        return "%s: %s" % (self.swap, self.stopped) if self.swap else "restart %d: %s" % (self.restart, self.stopped)


def _kept_until(x: Any) -> Optional[float]:
    """Up to the snapshot resumed from, else to where the ranks' own progress says they resumed."""
    saved = getattr(x, "resumed_saved_at", None)
    return saved if saved is not None else getattr(x, "kept_until", None)


def restart_marks(results: List[Any], hosts: Mapping[int, str]) -> Tuple[Tuple[RestartMark, ...], int]:
    """The latest in-step restarts of the control's calls (node 0 sees each), and the count left out."""
    found: List[RestartMark] = []
    for r in results:
        for x in getattr(r, "in_step_restarts", None) or ():
            back = x.ranks_at if x.ranks_at is not None else x.restarted_at
            found.append(RestartMark(
                call=r.call, restart=x.restart, failed_at=x.failed_at, stopped=x.cause.summary[:400],
                kind=x.cause.kind, stopped_at=x.stopped_at, back_at=back, work_from=x.work_from,
                swapped_out=x.swapped_out, swapped_in=x.swapped_in,
                out_host=hosts.get(x.swapped_out) if x.swapped_out is not None else None,
                in_host=hosts.get(x.swapped_in) if x.swapped_in is not None else None,
                resumed_step=getattr(x, "resumed_step", None), steps_lost=getattr(x, "steps_lost", None),
                kept_until=_kept_until(x), trained_at=getattr(x, "trained_at", None)))
    found.sort(key=lambda m: m.failed_at)
    return tuple(found[-MAX_RESTART_MARKS:]), max(0, len(found) - MAX_RESTART_MARKS)


@dataclass(frozen=True)
class Attempt(Lenient):
    """One attempt of the step, as the control's record keeps it."""

    attempt: Whole
    started_at: Optional[float] = None
    # Every decorator's task_pre_step done (@checkpoint's load among them).
    code_started_at: Optional[float] = None
    gang_formed_at: Optional[float] = None
    gang_formed_seconds: Optional[float] = None
    calls: Annotated[Tuple[CallStart, ...], Items(MAX_CALLS)] = ()
    ended_at: Optional[float] = None
    stopped: Annotated[Optional[str], Text(4000)] = None  # the cause's summary, "succeeded", "refused", or unknown
    kind: Optional[CauseKind] = None
    resumed_from: Optional[Checkpoint] = None
    refused_for: Optional[Whole] = None
    # What its failure cost (with_costs), once a next attempt is known.
    lost_work_seconds: Optional[float] = None
    restart_seconds: Optional[float] = None
    lost_seconds: Optional[float] = None
    # The ledger's marks: a rank's first line on the control, this record written.
    first_output_at: Optional[float] = None
    recorded_at: Optional[float] = None
    # Each node's host and role (node_roles.py), the bystanders left out, and
    # "ValueError at train.py:88" when the user's code failed (no node blamed).
    nodes: Annotated[Tuple[NodeEntry, ...], Items(MAX_NODES)] = ()
    nodes_left_out: Whole = 0
    code_failure: Annotated[Optional[str], Text(400)] = None
    # This attempt's own card's hash (`card view <task> --hash`).
    card: Annotated[Optional[str], Text(64)] = None
    restarts: Annotated[Tuple[RestartMark, ...], Items(MAX_RESTART_MARKS)] = ()
    restarts_left_out: Whole = 0
    # The nodes lost mid-step that the gang went on without and that had not come back when it ended:
    # the step ended without their tasks (the join's inputs leave them out).
    not_back: Annotated[Tuple[Whole, ...], Items(MAX_NODES), SKIP] = ()

    def to_wire(self) -> Dict[str, Any]:
        """By hand: the three costs are on the wire together or not at all (a null: a cost not known)."""
        data = encode(self)
        if self.lost_seconds is None:
            for name in ("lost_work_seconds", "restart_seconds", "lost_seconds"):
                del data[name]
        return data


def this_attempt(
    attempt: int, started_at: float, results: List[Any], cause: Optional[Cause],
    resumed_from: Optional[Checkpoint], refused_for: Optional[int] = None,
    code_started_at: Optional[float] = None, recorded_at: Optional[float] = None,
    nodes: Tuple[NodeEntry, ...] = (), nodes_left_out: int = 0, card: Optional[str] = None,
    hosts: Optional[Mapping[int, str]] = None, not_back: Tuple[int, ...] = (),
) -> Attempt:
    """This attempt's entry (``hosts``: every node's, for the swaps; else the nodes')."""
    joined = [float(t) for t in results[0].gang.joined_at.values()] if results else []
    formed = max(joined) if joined else None
    ended = max([r.ended_at for r in results] or [started_at])
    stopped = cause.summary if cause is not None else ("refused" if refused_for is not None else "succeeded")
    known = hosts if hosts is not None else {n.node: n.host for n in nodes}
    restarts, restarts_left_out = restart_marks(results, known)
    return Attempt(attempt=attempt, started_at=started_at, code_started_at=code_started_at,
                   gang_formed_at=formed, gang_formed_seconds=formed - started_at if formed is not None else None,
                   calls=tuple(CallStart(r.call, r.started_at) for r in results),
                   ended_at=(cause.time if cause is not None else None) or ended, stopped=stopped,
                   kind=cause.kind if cause is not None else None, resumed_from=resumed_from,
                   refused_for=refused_for, first_output_at=first_output(results), recorded_at=recorded_at,
                   nodes=nodes, nodes_left_out=nodes_left_out, code_failure=user_code_failure(cause), card=card,
                   restarts=restarts, restarts_left_out=restarts_left_out, not_back=tuple(not_back))


def first_output(results: List[Any]) -> Optional[float]:
    """The end of start-up: a rank's first line on the control, else its ranks' latest start."""
    if not results:
        return None
    if results[0].first_output_at is not None:
        return float(results[0].first_output_at)
    return max((rank.start for rank in results[0].ranks if rank.start is not None), default=None)


@dataclass(frozen=True)
class Marks:
    """One attempt's marks on the step's clock, each clamped to the ones before.
    The goodput ledger and the attempts' costs cut time at these same marks, so they agree."""

    start: float
    formed: float
    first: float
    work_end: float
    end: float


def marks(a: Attempt, end: float) -> Marks:
    start = min(a.started_at if a.started_at is not None else end, end)
    formed = clamp(a.gang_formed_at, start, end)
    call = a.calls[0].started_at if a.calls else None
    first = clamp(a.first_output_at if a.first_output_at is not None else call, formed, end)
    work_end = clamp(a.ended_at if a.calls else None, first, end)
    return Marks(start, formed, first, work_end, end)


def clamp(value: Optional[float], low: float, high: float) -> float:
    return low if value is None else min(max(value, low), high)


def lost_since(m: Marks, saved_at: Optional[float], low: Optional[float] = None) -> float:
    """Where lost work starts: the checkpoint resumed from, else the last ranks' start (``low``)."""
    low = m.first if low is None else low
    return clamp(saved_at, low, m.work_end) if saved_at is not None else low


@dataclass(frozen=True)
class Cut:
    """An in-step restart on the attempt's clock, each mark clamped to the ones before."""

    mark: RestartMark
    failed: float
    stopped: float
    back: float  # the new ranks at the script
    trained: float  # their training begun: their first snapshot, else ``back``


def in_step_cuts(a: Attempt, m: Marks) -> Tuple[float, Tuple[Cut, ...]]:
    """The end of start-up and the in-step restarts; with one, start-up ends at its ``work_from``."""
    listed = sorted(a.restarts, key=lambda r: r.failed_at)
    first = m.first
    if listed:
        head = listed[0]
        first = clamp(min(m.first, head.work_from if head.work_from is not None else head.failed_at),
                      m.formed, m.work_end)
    low, cuts = first, []
    for r in listed:
        failed = clamp(r.failed_at, low, m.work_end)
        stopped = clamp(r.stopped_at if r.stopped_at is not None else failed, failed, m.work_end)
        back = clamp(r.back_at if r.back_at is not None else stopped, stopped, m.work_end)
        trained = clamp(r.trained_at, back, m.work_end)
        cuts.append(Cut(r, failed, stopped, back, trained))
        low = trained
    return first, tuple(cuts)


def with_costs(attempts: List[Attempt]) -> List[Attempt]:
    """What each failure cost at the ledger's marks: the work lost, and the failure to the next first line."""
    out = list(attempts)
    for i, (failed, nxt) in enumerate(zip(attempts, attempts[1:])):
        if failed.ended_at is None:
            continue
        end = nxt.started_at if nxt.started_at is not None else failed.recorded_at or failed.ended_at
        m = marks(failed, min(failed.recorded_at, end) if failed.recorded_at is not None else end)
        saved = nxt.resumed_from.created_at if nxt.resumed_from is not None else None
        first, cuts = in_step_cuts(failed, m)
        lost_work = m.work_end - lost_since(m, saved, cuts[-1].trained if cuts else first)
        restart = None
        if nxt.started_at is not None and (nxt.calls or nxt.first_output_at is not None):
            restart = max(0.0, marks(nxt, math.inf).first - m.work_end)
        parts = [p for p in (lost_work, restart) if p is not None]
        out[i] = replace(failed, lost_work_seconds=lost_work, restart_seconds=restart, lost_seconds=sum(parts))
    return out


def read_previous(pathspec: str, attempt: int, field: str) -> Tuple[Optional[Previous], Optional[str]]:
    """Attempt ``attempt``'s record, and a note when it could not be read (none left: None, None)."""
    try:
        task = Task(pathspec, attempt=attempt, _namespace_check=False)
        values = [m for m in task.metadata if m.name == field]
    except Exception as e:  # the record helps; it must never stop the step
        return None, "could not read attempt %d's record (%s)" % (attempt, e)
    if not values:
        return None, None
    latest = sorted(values, key=lambda m: m.created_at or 0)[-1]
    try:
        record = json.loads(latest.value)
    except (TypeError, ValueError):
        return None, "attempt %d's record is not JSON" % attempt
    previous = Previous.from_wire(record)
    return (previous, None) if previous is not None else (None, "attempt %d's record is not an object" % attempt)
