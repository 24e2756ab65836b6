"""What ``current.torch.run`` returns, and what is kept after the run.

The same record is returned to the step, attached to the exception when the run
fails, stored as task metadata (``torchrun-result``, readable with the Metaflow
client after the run) and drawn in the step's card.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

if TYPE_CHECKING:
    from .attempts import Attempt
    from .in_step_restarts import InStepRestart
    from .goodput import Ledger
    from .what_ran import Ran
    from ..procs import Culprits

from ..cause import Cause, CauseKind
from ..base.codec import Written
from ..gang import NodeReport
from ..gang import PreflightRecord, ProgressRecord
from ..procs import RankFailure
from ..procs import numbers
from ..procs import SUMMARY_PLACES, bound, group
from ..procs import rank_log_path
from ..procs import RankStatus, read_statuses

METADATA_FIELD = "torchrun-result"
# A compacted record keeps this many of a call's in-step restarts.
RESTARTS_IN_COMPACT = 8
# The record is stored in the metadata service: at most this many bytes of JSON,
# whatever the gang's size (8,192 ranks' stacks and output tails are megabytes).
METADATA_LIMIT = 96 * 1024
# Characters of rank stacks kept in the record when it fits (the card and the
# full report show them whole).
STACKS_IN_RECORD = 64 * 1024
# On the control node, the artifact that holds the full report of every call:
# every rank's stack and output tail, however many.
REPORT_ARTIFACT = "torchrun_report"
# The full report's stacks, at most (a rank's dump is already cut to 16 KiB).
STACKS_IN_REPORT = 64 << 20
# In a compacted record, per node: at most this many failed ranks named.
FAILED_PER_NODE = 8
# The record's swaps (@torchrun(spares)), at most: a swap benches a spare for
# good, so a step has at most its spares' count of them (64 at most).
SWAPS_IN_RECORD = 64


# One rank's record in the result: the rank status schema (procs/status.py).
RankRecord = RankStatus


@dataclass(frozen=True)
class GangView(Written):
    """The gang as the control saw one call: when each node joined it and
    finished it, and each node's report (its ranks and their last lines)."""

    joined_at: Dict[int, float] = field(default_factory=dict)
    finished_at: Dict[int, float] = field(default_factory=dict)
    reports: Dict[int, NodeReport] = field(default_factory=dict)


@dataclass
class TorchrunResult:
    """What happened on this node."""

    command: List[str]
    node_index: int
    num_nodes: int
    nproc_per_node: Union[int, str]
    exit_code: Optional[int]
    started_at: float
    ended_at: float
    main_addr: str = ""
    local_addr: str = ""
    rdzv_port: Optional[int] = None
    gang_port: Optional[int] = None
    ranks: List[RankRecord] = field(default_factory=list)
    restarts: int = 0
    log_dir: Optional[str] = None
    # Set when the run failed: the gang's root cause.
    cause: Optional[Cause] = None
    # On the control node: the gang as the control saw it (empty elsewhere).
    gang: GangView = field(default_factory=GangView)
    # Function entrypoints: return values of this node's ranks by global rank;
    # on the control node rank 0's value is always there.
    returns: Dict[int, Any] = field(default_factory=dict)
    # Which current.torch.run call of the step this was (0-based).
    call: int = 0
    # When the job was stopped: where each rank was (rank -> faulthandler's
    # dump of its threads; every node's on the control), and the seconds that
    # collecting them added to the stop.
    stacks: Dict[int, str] = field(default_factory=dict)
    stack_seconds: float = 0.0
    # On the control, when ranks waited in a collective at the stop: the ranks
    # not in it, by rank, node and host (procs/culprit.py); bounded.
    culprits: Optional["Culprits"] = None
    # On the control, when no suspect was named and some ranks' Flight Recorder
    # could not be read: why not, one bounded line (procs/culprit.py); "" otherwise.
    flight_unread: str = ""
    # On the control: @torchrun(preflight=...)'s findings for the whole gang,
    # bounded whatever its size (gang/node_compare.py, runtime/preflight.py).
    preflight: Optional[PreflightRecord] = None
    # On the control: every attempt of the step so far, this one last
    # (record/attempts.py: start, gang formed, calls, why it stopped, the
    # checkpoint it resumed from, what each failure cost).
    attempts: List["Attempt"] = field(default_factory=list)
    # This call's in-step restarts (@torchrun(restarts), record/in_step_restarts.py),
    # each like an attempt: its cause, the work it lost, the time to restart.
    in_step_restarts: List["InStepRestart"] = field(default_factory=list)
    # What ran (record/what_ran.py): the entrypoint, its arguments with
    # secret-looking ones masked, the torchrun command, versions.
    ran: Optional["Ran"] = None
    # When a rank of this node first wrote a line (epoch; None: none did, or
    # labels were off): where start-up ends in the goodput ledger.
    first_output_at: Optional[float] = None
    # On the control: where the step's wall time went, across its attempts
    # (record/goodput.py).
    goodput: Optional["Ledger"] = None
    # On the control: the gang's training progress when the call ended (step,
    # total, ETA, steps/s, the last metrics, the slowest node) and the
    # stragglers named (gang/gang_progress.py); None elsewhere.
    progress: Optional[ProgressRecord] = None
    # @torchrun(spares): this node's part when the call ended ("active", a
    # "spare" never used, or "out": taken out after a failure pinned to it),
    # and the nodes that sat the call out then (at most K of each).
    role: str = "active"
    spare_nodes: List[int] = field(default_factory=list)
    out_nodes: List[int] = field(default_factory=list)

    @property
    def duration(self) -> float:
        return self.ended_at - self.started_at

    @property
    def succeeded(self) -> bool:
        """Its ranks all ended well, or it sat the call out (a spare, or taken out) and the gang succeeded."""
        return (self.exit_code == 0 or self.role != "active") and self.cause is None

    @property
    def active_nodes(self) -> List[int]:
        """The nodes that trained when the call ended (derived: the record keeps only the benched)."""
        benched = set(self.spare_nodes) | set(self.out_nodes)
        return [n for n in range(self.num_nodes) if n not in benched]

    def swaps(self) -> List[Dict[str, Any]]:
        """The call's swaps, each small (its cause is in ``in_step_restarts``):
        which node went out and which spare came in, with their hosts where
        the attempt's record has them (the control's), when and why. Kept
        whole in a compacted record, which keeps only some restarts."""
        hosts: Dict[int, str] = {}
        for mark in (self.attempts[-1].restarts if self.attempts else ()):
            hosts.update({n: h for n, h in ((mark.swapped_out, mark.out_host), (mark.swapped_in, mark.in_host))
                          if n is not None and h})
        return [{"restart": r.restart, "out": r.swapped_out, "in": r.swapped_in, "out_host": hosts.get(r.swapped_out),
                 "in_host": hosts.get(r.swapped_in), "failed_at": r.failed_at, "stopped": r.cause.summary[:400]}
                for r in self.in_step_restarts
                if r.swapped_out is not None and r.swapped_in is not None][-SWAPS_IN_RECORD:]

    def __str__(self) -> str:
        """One short line (``print(result)``); ``repr`` keeps every field."""
        code = "not run" if self.exit_code is None else "exit code %d" % self.exit_code
        return "TorchrunResult(node %d of %d, %s, %d ranks here, %.1f s, logs: %s)" % (
            self.node_index, self.num_nodes, code, len(self.ranks), self.duration, self.log_dir or "none")

    def rank_logs(self) -> Dict[int, Dict[str, str]]:
        """Where each rank's stdout and stderr were copied on this node."""
        if not self.log_dir:
            return {}
        return {
            r.rank: {
                s: rank_log_path(self.log_dir, r.rank, s)
                for s in ("stdout", "stderr")
            }
            for r in self.ranks
        }

    def to_dict(self, stacks_limit: int = STACKS_IN_REPORT) -> Dict[str, Any]:
        """JSON-able, without return values (they may be anything): the full
        report (``REPORT_ARTIFACT``). By hand, not by codec.py: its stacks' bound
        is an argument, and the stored shape has ``{}`` for no preflight,
        culprits or ran, and each rank's ``duration``, which no field holds."""
        data = {f: getattr(self, f) for f in self.__dataclass_fields__ if f not in ("returns",)}
        data["ranks"] = [asdict(r) for r in self.ranks]
        data["cause"] = self.cause.to_wire() if self.cause is not None else None
        data["gang"] = self.gang.to_wire()
        data["preflight"] = self.preflight.to_wire() if self.preflight is not None else {}
        data["attempts"] = [a.to_wire() for a in self.attempts]
        data["in_step_restarts"] = [r.to_wire() for r in self.in_step_restarts]
        data["swaps"] = self.swaps()
        data["goodput"] = self.goodput.to_wire() if self.goodput is not None else None
        data["culprits"] = self.culprits.to_wire() if self.culprits is not None else {}
        data["ran"] = self.ran.to_wire() if self.ran is not None else {}
        data["progress"] = self.progress.to_wire() if self.progress is not None else None
        data["command"] = list(self.command)
        data["duration"] = self.duration
        data["succeeded"] = self.succeeded
        for r, rec in zip(data["ranks"], self.ranks):
            r["duration"] = rec.duration
        data["stacks"] = {str(k): v for k, v in bound(self.stacks, stacks_limit).items()}
        return data

    def to_json(self, full_report: str = REPORT_ARTIFACT) -> str:
        """The record kept as task metadata: the whole of it when it fits in
        ``METADATA_LIMIT``, else the same fields compacted (ranks grouped by
        where they were, nodes summarized), naming where the full report is."""
        data = self.to_dict(STACKS_IN_RECORD)
        text = json.dumps(data, default=str)
        if len(text) <= METADATA_LIMIT:
            return text
        data = compact(data, self.stacks, full_report)
        text = json.dumps(data, default=str)
        if len(text) > METADATA_LIMIT:  # a gang of many thousand nodes: counts only
            data["gang"] = {"nodes": data["gang"].get("nodes")}
            text = json.dumps(data, default=str)
        if len(text) > METADATA_LIMIT:  # attempts of big gangs: their bystanders counted, not listed
            for attempt in data["attempts"]:
                nodes = attempt.get("nodes") or []
                attempt["nodes"] = [n for n in nodes if n.get("role") != "bystander"]
                attempt["nodes_left_out"] = attempt.get("nodes_left_out", 0) + len(nodes) - len(attempt["nodes"])
            text = json.dumps(data, default=str)
        return text


def compact(data: Dict[str, Any], stacks: Dict[int, str], full_report: str) -> Dict[str, Any]:
    """A record for a big gang: per node a summary of its ranks instead of
    every rank and its output, and the ranks' stacks as the places they were."""
    gang = data.get("gang") or {}
    nodes: Dict[str, Any] = {}
    for node, report in (gang.get("reports") or {}).items():
        ranks = report.get("ranks") or []
        failed = [[r.get("rank"), r.get("exit_code")] for r in ranks if r.get("exit_code") not in (0, None)]
        nodes[node] = {"ranks": len(ranks), "failed": failed[:FAILED_PER_NODE], "failed_count": len(failed),
                       "started": report.get("started"), "ended": report.get("ended")}
    joined = gang.get("joined_at") or {}
    finished = gang.get("finished_at") or {}
    data["gang"] = {
        "nodes": nodes,
        "joined": _times(joined),
        "finished": _times(finished),
    }
    data["stacks"] = {}
    data["stack_places"] = [
        {"ranks": numbers(ranks), "count": len(ranks), "place": list(place)}
        for place, ranks in group(stacks)[:SUMMARY_PLACES]
    ]
    restarts = data.get("in_step_restarts") or []
    if len(restarts) > RESTARTS_IN_COMPACT:  # the first and the latest few, each whole
        data["in_step_restarts"] = restarts[:1] + restarts[-(RESTARTS_IN_COMPACT - 1):]
        data["in_step_restarts_count"] = len(restarts)
    data["compacted"] = True
    data["full_report"] = full_report
    return data


def _times(stamps: Dict[str, Any]) -> Dict[str, Any]:
    values = sorted((v, k) for k, v in stamps.items() if isinstance(v, (int, float)))
    if not values:
        return {"count": 0}
    return {"count": len(values), "first": values[0][0], "last": values[-1][0], "last_node": values[-1][1]}


def read_rank_records(directory: str, failures: List[RankFailure]) -> List[RankRecord]:
    """The status each rank wrote, completed with torchrun's report for ranks
    that died before they could write their exit."""
    records: Dict[int, RankRecord] = read_statuses(directory)
    for failure in failures:
        rec = records.get(failure.rank)
        if rec is None:
            rec = RankRecord(failure.rank, failure.local_rank, pid=failure.pid)
        if rec.exit_code is None:
            rec = replace(rec, exit_code=_code_from(failure.exc_type), end=rec.end or failure.timestamp)
        records[failure.rank] = rec
    return [records[k] for k in sorted(records)]


def _code_from(description: str) -> Optional[int]:
    import signal

    text = description or ""
    if text.startswith("killed by signal "):
        name = text[len("killed by signal ") :]
        try:
            return -int(getattr(signal.Signals, name))
        except (AttributeError, ValueError):
            try:
                return -int(name)
            except ValueError:
                return None
    if text.startswith("exit code "):
        try:
            return int(text.split()[2])
        except (IndexError, ValueError):
            return None
    return None


def suspected(culprits: Optional["Culprits"], cause: Optional[Cause]) -> List[str]:
    """The "Suspected cause" lines the failure says, and the card: none where
    a failed rank is the root cause (its own error names it already)."""
    if culprits is None or (cause is not None and cause.kind is CauseKind.RANK_FAILED):
        return []
    return culprits.lines()


def none_suspected(culprits: Optional["Culprits"], unread: str, cause: Optional[Cause]) -> List[str]:
    """Where nothing named a suspect though one was looked for: the one line
    that says why the Flight Recorder could not (the card's root cause)."""
    if culprits is not None or not unread or (cause is not None and cause.kind is CauseKind.RANK_FAILED):
        return []
    return ["No suspect named: torch's Flight Recorder could not say (%s)" % unread]
