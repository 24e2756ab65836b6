"""What ``current.torch.run`` returns: returned to the step, attached to the
exception when the run fails, stored as task metadata (``torchrun-result``,
read with the Metaflow client) and drawn in the step's card.
"""

from __future__ import annotations

import json
import signal
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

if TYPE_CHECKING:  # `import metaflow` exports TorchrunResult: what its fields hold loads at first use
    from .attempts import Attempt
    from .in_step_restarts import InStepRestart
    from .goodput import Ledger
    from .what_ran import Ran
    from .gang_view import GangView
    from ..cause import Cause
    from ..gang import PreflightRecord, ProgressRecord
    from ..procs.culprit import Culprits
    from ..procs.failures import RankFailure
    from ..procs.status import RankStatus as RankRecord  # one rank's record (procs/status.py)

METADATA_FIELD = "torchrun-result"
# The metadata service holds the record: at most this many bytes of JSON at any
# gang size (8,192 ranks' stacks and output tails are megabytes), with at most
# this many characters of stacks, and when compacted, of a call's in-step
# restarts and of each node's failed ranks.
METADATA_LIMIT = 96 * 1024
STACKS_IN_RECORD = 64 * 1024
RESTARTS_IN_COMPACT = 8
FAILED_PER_NODE = 8
# The control's artifact of every call's full report, and its stacks at most
# (a rank's dump is already cut to 16 KiB).
REPORT_ARTIFACT = "torchrun_report"
STACKS_IN_REPORT = 64 << 20
# A swap benches a spare for good: a step has at most its spares' (64) of them.
SWAPS_IN_RECORD = 64


def __getattr__(name: str) -> Any:
    """``RankRecord``: one rank's record, procs/status.py's ``RankStatus``, loaded at its first use."""
    if name == "RankRecord":
        from ..procs.status import RankStatus

        return RankStatus
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


# Stored as {} when absent, as the hand-written record stored them.
_NONE_AS_EMPTY = ("preflight", "culprits", "ran")


def _no_view() -> GangView:
    """``TorchrunResult.gang`` until the control fills it: its module loads at a result's making."""
    from .gang_view import GangView

    return GangView()


# ``__init__``, ``repr`` and ``==`` by hand, as dataclasses writes them: made per class from its 33 fields,
# they cost every ``import metaflow`` (which exports this class) about 2.5 ms. A unit test keeps
# ``__init__``'s parameters those of the fields.
@dataclass(init=False, repr=False, eq=False)
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
    restarts: int = 0  # the in-step restarts used; ``restarts_allowed``, @torchrun(restarts=N)'s N
    restarts_allowed: int = 0
    log_dir: Optional[str] = None
    cause: Optional[Cause] = None  # the gang's root cause, when the run failed
    gang: GangView = field(default_factory=_no_view)  # on the control: the gang as it saw it
    # A function's return values by global rank (this node's; rank 0's on the control).
    returns: Dict[int, Any] = field(default_factory=dict)
    call: int = 0  # which current.torch.run call of the step (0-based)
    # At a stop: each rank's threads (faulthandler; every node's on the
    # control), and the seconds collecting them added to the stop.
    stacks: Dict[int, str] = field(default_factory=dict)
    stack_seconds: float = 0.0
    # On the control, when ranks waited in a collective at the stop: the ranks
    # not in it (procs/culprit.py); else why the Flight Recorder could not say.
    culprits: Optional["Culprits"] = None
    flight_unread: str = ""
    # On the control: the preflight's findings for the whole gang, bounded;
    # every attempt of the step so far, this one last (record/attempts.py).
    preflight: Optional[PreflightRecord] = None
    attempts: List["Attempt"] = field(default_factory=list)
    # This call's @torchrun(restarts), each with its cause and what it cost.
    in_step_restarts: List["InStepRestart"] = field(default_factory=list)
    ran: Optional["Ran"] = None  # what ran, secret-looking arguments masked (record/what_ran.py)
    # A rank of this node's first line (None: none, or labels off): the goodput ledger's end of start-up.
    first_output_at: Optional[float] = None
    # On the control: where the step's wall time went (record/goodput.py), and
    # the gang's training progress and stragglers as the call ended.
    goodput: Optional["Ledger"] = None
    progress: Optional[ProgressRecord] = None
    # @torchrun(spares): this node's part as the call ended ("active", "spare"
    # or "out": taken out for a failure pinned to it), and who sat it out.
    role: str = "active"
    spare_nodes: List[int] = field(default_factory=list)
    out_nodes: List[int] = field(default_factory=list)

    def __init__(self, command: List[str], node_index: int, num_nodes: int, nproc_per_node: Union[int, str],
                 exit_code: Optional[int], started_at: float, ended_at: float, main_addr: str = "",
                 local_addr: str = "", rdzv_port: Optional[int] = None, gang_port: Optional[int] = None,
                 ranks: Optional[List[RankRecord]] = None, restarts: int = 0, restarts_allowed: int = 0,
                 log_dir: Optional[str] = None, cause: Optional[Cause] = None, gang: Optional[GangView] = None,
                 returns: Optional[Dict[int, Any]] = None, call: int = 0, stacks: Optional[Dict[int, str]] = None,
                 stack_seconds: float = 0.0, culprits: Optional[Culprits] = None, flight_unread: str = "",
                 preflight: Optional[PreflightRecord] = None, attempts: Optional[List[Attempt]] = None,
                 in_step_restarts: Optional[List[InStepRestart]] = None, ran: Optional[Ran] = None,
                 first_output_at: Optional[float] = None, goodput: Optional[Ledger] = None,
                 progress: Optional[ProgressRecord] = None, role: str = "active",
                 spare_nodes: Optional[List[int]] = None, out_nodes: Optional[List[int]] = None) -> None:
        """Every field by its name; a list, a dict or the gang view not given (None) is a fresh empty one."""
        given = locals()
        for f in fields(self):
            value = given[f.name]
            setattr(self, f.name, f.default_factory() if value is None and f.default_factory is not MISSING
                    else value)

    def __repr__(self) -> str:
        return "%s(%s)" % (type(self).__qualname__, ", ".join("%s=%r" % f for f in self._values()))

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def _values(self) -> List[Tuple[str, Any]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self)]

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

    @property
    def swaps(self) -> List[Dict[str, Any]]:
        """Who went out, which spare came in, when and why (derived, as ``active_nodes``; the stored
        record holds this list): small, so a compacted record keeps all."""
        marks = self.attempts[-1].restarts if self.attempts else ()
        hosts = {n: h for m in marks for n, h in ((m.swapped_out, m.out_host), (m.swapped_in, m.in_host))
                 if n is not None and h}
        return [{"restart": r.restart, "out": r.swapped_out, "in": r.swapped_in, "out_host": hosts.get(r.swapped_out),
                 "in_host": hosts.get(r.swapped_in), "failed_at": r.failed_at, "stopped": r.cause.summary[:400]}
                for r in self.in_step_restarts
                if r.swapped_out is not None and r.swapped_in is not None][-SWAPS_IN_RECORD:]

    def __str__(self) -> str:
        """One short line (``print(result)``); ``repr`` keeps every field. A node benched as the call ended
        says so: one taken out ran its ranks until the swap (its last start sat out, so no exit code)."""
        code = ("taken out" if self.role == "out" else "a spare, not run" if self.role == "spare"
                else "not run" if self.exit_code is None else "exit code %d" % self.exit_code)
        return "TorchrunResult(node %d of %d, %s, %d ranks here, %.1f s, logs: %s)" % (
            self.node_index, self.num_nodes, code, len(self.ranks), self.duration, self.log_dir or "none")

    def rank_logs(self) -> Dict[int, Dict[str, str]]:
        """Where each rank's stdout and stderr were copied on this node."""
        from ..procs.names import rank_log_path

        log_dir = self.log_dir
        return {r.rank: {s: rank_log_path(log_dir, r.rank, s) for s in ("stdout", "stderr")}
                for r in self.ranks} if log_dir else {}

    def to_dict(self, stacks_limit: int = STACKS_IN_REPORT) -> Dict[str, Any]:
        """JSON-able, without return values (they may be anything): the full report.
        By hand: its stacks' bound is an argument, and a rank's ``duration`` is no field."""
        from ..procs.stacks import bound

        data = {f: getattr(self, f) for f in self.__dataclass_fields__ if f != "returns"}
        for name in ("cause", "gang", "preflight", "culprits", "ran", "goodput", "progress"):
            value = getattr(self, name)
            data[name] = value.to_wire() if value is not None else {} if name in _NONE_AS_EMPTY else None
        data.update(ranks=[dict(asdict(r), duration=r.duration) for r in self.ranks], command=list(self.command),
                    attempts=[a.to_wire() for a in self.attempts],
                    in_step_restarts=[r.to_wire() for r in self.in_step_restarts], swaps=self.swaps,
                    duration=self.duration, succeeded=self.succeeded,
                    stacks={str(k): v for k, v in bound(self.stacks, stacks_limit).items()})
        return data

    def to_json(self, full_report: str = REPORT_ARTIFACT) -> str:
        """The record as task metadata: whole when it fits in ``METADATA_LIMIT``,
        else compacted, naming where the full report is."""
        return self.stored(full_report).text

    def stored(self, full_report: str = REPORT_ARTIFACT) -> "StoredRecord":
        """``to_json``'s text, and whether it was compacted (then the full report is kept apart)."""
        data = self.to_dict(STACKS_IN_RECORD)
        text = json.dumps(data, default=str)
        if len(text) <= METADATA_LIMIT:
            return StoredRecord(text, compacted=False)
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
        return StoredRecord(text, compacted=True)


class StoredRecord:
    """The record's JSON as stored, and whether it is the compacted one (a big gang's). A plain class:
    ``import metaflow`` loads this module, and a dataclass's or a NamedTuple's making costs it."""

    __slots__ = ("text", "compacted")

    def __init__(self, text: str, compacted: bool) -> None:
        self.text, self.compacted = text, compacted


def compact(data: Dict[str, Any], stacks: Dict[int, str], full_report: str) -> Dict[str, Any]:
    """A big gang's record: per node a summary of its ranks, and the stacks as the places they were."""
    from ..procs.ranges import numbers
    from ..procs.stacks import SUMMARY_PLACES, group

    gang = data.get("gang") or {}
    nodes: Dict[str, Any] = {}
    for node, report in (gang.get("reports") or {}).items():
        ranks = report.get("ranks") or []
        failed = [[r.get("rank"), r.get("exit_code")] for r in ranks if r.get("exit_code") not in (0, None)]
        nodes[node] = {"ranks": len(ranks), "failed": failed[:FAILED_PER_NODE], "failed_count": len(failed),
                       "started": report.get("started"), "ended": report.get("ended")}
    data["gang"] = {"nodes": nodes, "joined": _times(gang.get("joined_at") or {}),
                    "finished": _times(gang.get("finished_at") or {})}
    data["stacks"] = {}
    data["stack_places"] = [{"ranks": numbers(ranks), "count": len(ranks), "place": list(place)}
                            for place, ranks in group(stacks)[:SUMMARY_PLACES]]
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
    """Each rank's status file, completed by torchrun's report for ranks that died before writing."""
    from ..procs.status import RankStatus as RankRecord, read_statuses

    records: Dict[int, RankRecord] = read_statuses(directory)
    for failure in failures:
        rec = records.get(failure.rank) or RankRecord(failure.rank, failure.local_rank, pid=failure.pid)
        if rec.exit_code is None:
            rec = replace(rec, exit_code=_code_from(failure.exc_type), end=rec.end or failure.timestamp)
        records[failure.rank] = rec
    return [records[k] for k in sorted(records)]


def _code_from(description: str) -> Optional[int]:
    text = description or ""
    try:
        if text.startswith("killed by signal "):
            name = text[len("killed by signal "):]
            return -int(signal.Signals[name] if name in signal.Signals.__members__ else name)
        if text.startswith("exit code "):
            return int(text.split()[2])
    except (IndexError, ValueError):
        pass
    return None


def suspected(culprits: Optional["Culprits"], cause: Optional[Cause]) -> List[str]:
    """The "Suspected cause" lines; none where a failed rank is the root cause (its error names it)."""
    from ..cause import CauseKind

    if culprits is None or (cause is not None and cause.kind is CauseKind.RANK_FAILED):
        return []
    return culprits.lines()


def none_suspected(culprits: Optional["Culprits"], unread: str, cause: Optional[Cause]) -> List[str]:
    """Where no suspect was named though one was looked for: why the Flight Recorder could not say."""
    from ..cause import CauseKind

    if culprits is not None or not unread or (cause is not None and cause.kind is CauseKind.RANK_FAILED):
        return []
    return ["No suspect named: torch's Flight Recorder could not say (%s)" % unread]
