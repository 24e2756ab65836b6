"""Preflight on the control: compare every node's fingerprint and fitness
checks, and decide before any rank starts whether the gang can train.

Values are grouped (one dict per field) and a message names at most
``MAX_GROUPS`` values per field, so at 1,024 nodes a refusal is still a few
lines: ``nodes 3, 17 have torch 2.12.0 (majority 2.13.0 on 1022 nodes)``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..cause import Cause, CauseKind, plural
from ..base.codec import Written
from . import messages as msg

# Fields whose difference is reported, not refused: nodes of one cluster often
# run different kernel patch levels, and training does not care.
WARN_ONLY_FIELDS = ("kernel",)
MAX_GROUPS = 8  # values named per field in a message (the rest are counted)
MAX_LISTED = 64  # nodes listed per group in the record
MAX_ROWS = 64  # rows of the per-node table kept in the record
ROW_TEXT = 80

FIX_VERSIONS = ("build every node from one image (or one environment: @pypi/@conda pins, the same "
                "--environment), so that every node runs the same software")

# node -> its fingerprint; node -> its checks; a finding and the nodes that share it.
Fingerprints = Mapping[int, Mapping[str, str]]
Checks = Mapping[int, Sequence[msg.PreflightCheck]]
CheckGroup = Tuple[msg.PreflightCheck, List[int]]

# The node history's check (record/node_history.py): hosts -> the lines it
# says, the refusal (preflight="strict"), the nodes whose host it blames.
HostCheck = Callable[[Dict[int, str]], Tuple[List[str], Optional[Cause], List[int]]]


@dataclass(frozen=True)
class Difference:
    field: str
    majority: str
    majority_count: int
    others: Tuple[Tuple[str, Tuple[int, ...]], ...]  # (value, nodes), largest group first

    @property
    def refused(self) -> bool:
        return self.field not in WARN_ONLY_FIELDS

    def describe(self) -> str:
        """``torch: nodes 3, 17 have 2.12.0 (majority 2.13.0 on 1022 nodes)``."""
        parts = ["%s %s %s" % (plural(list(nodes)), "has" if len(nodes) == 1 else "have", value or "none")
                 for value, nodes in self.others[:MAX_GROUPS]]
        rest = self.others[MAX_GROUPS:]
        if rest:
            parts.append("%d more values on %d nodes" % (len(rest), sum(len(n) for _, n in rest)))
        tied = bool(self.others) and len(self.others[0][1]) == self.majority_count
        return "%s: %s (%s %s on %d node%s)" % (
            self.field, "; ".join(parts), "tied; the reference is node 0's," if tied else "majority",
            self.majority or "none", self.majority_count, "" if self.majority_count == 1 else "s")


def group_values(fingerprints: Fingerprints) -> Dict[str, Dict[str, List[int]]]:
    """field -> value -> nodes. A node that could not measure is left out: not knowing is no reason to refuse."""
    groups: Dict[str, Dict[str, List[int]]] = {name: {} for name in msg.FINGERPRINT_FIELDS}
    for node in sorted(fingerprints):
        versions = fingerprints[node]
        if not versions:
            continue
        for name in msg.FINGERPRINT_FIELDS:
            groups[name].setdefault(versions.get(name) or "none", []).append(node)
    return groups


def differences(fingerprints: Fingerprints) -> List[Difference]:
    """Each with its majority value (ties: the lowest node's)."""
    out = []
    for name, by_value in group_values(fingerprints).items():
        if len(by_value) < 2:
            continue
        ordered = sorted(by_value.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
        majority, nodes = ordered[0]
        others = tuple((value, tuple(n)) for value, n in ordered[1:])
        out.append(Difference(name, majority, len(nodes), others))
    return out


def group_checks(checks: Checks, status: str) -> List[CheckGroup]:
    """Grouped by what was found, expected and the fix: one example check and its nodes per group."""
    groups: Dict[Tuple[str, str, str, str], CheckGroup] = {}
    for node in sorted(checks):
        for check in checks[node]:
            if check.status == status:
                key = (check.name, check.found, check.expected, check.fix)
                groups.setdefault(key, (check, []))[1].append(node)
    return sorted(groups.values(), key=lambda g: (g[0].name, g[1][0]))


def describe_checks(groups: List[CheckGroup]) -> List[str]:
    """One line per group, at most ``MAX_GROUPS`` per check."""
    lines: List[str] = []
    per_check: Dict[str, int] = {}
    for check, nodes in groups:
        seen = per_check[check.name] = per_check.get(check.name, 0) + 1
        if seen > MAX_GROUPS:
            continue
        line = "%s on %s: found %s" % (check.name, plural(nodes), check.found or "?")
        if check.expected:
            line += ", expected %s" % check.expected
        if check.fix:
            line += ". Fix: %s" % check.fix
        lines.append(line)
    for name, count in per_check.items():
        if count > MAX_GROUPS:
            lines.append("%s: %d more kinds of finding not shown" % (name, count - MAX_GROUPS))
    return lines


def verdict(fingerprints: Fingerprints, checks: Checks) -> Optional[Cause]:
    """A fingerprint field that differs (kernel aside) or a check that failed, or None."""
    refused, failed = _refused(fingerprints, checks)
    if not refused and not failed:
        return None
    lines = []
    if refused:
        lines.append("the nodes run different software:")
        lines.extend("  " + d.describe() for d in refused)
        lines.append("  Fix: " + FIX_VERSIONS + ".")
    if failed:
        lines.append("a check failed:")
        lines.extend("  " + line for line in describe_checks(failed))
    first = refused[0].describe() if refused else describe_checks(failed)[0]
    nodes = unfit(fingerprints, checks)
    return Cause(CauseKind.PREFLIGHT, "preflight refused the gang before any rank started: %s" % first,
                 node_index=nodes[0] if nodes else None, message="\n".join(lines)[:4000])


def unfit(fingerprints: Fingerprints, checks: Checks) -> List[int]:
    """Those whose software differs from the reference's, and those whose checks failed."""
    refused, failed = _refused(fingerprints, checks)
    return sorted({n for d in refused for _, group in d.others for n in group} | {n for _, g in failed for n in g})


def _refused(fingerprints: Fingerprints, checks: Checks) -> Tuple[List[Difference], List[CheckGroup]]:
    return [d for d in differences(fingerprints) if d.refused], group_checks(checks, "fail")


def warnings(fingerprints: Fingerprints, checks: Checks) -> List[str]:
    """Once the gang passed: checks that warned, fields that differ without refusing (the kernel)."""
    lines = ["versions differ (not refused): " + d.describe() for d in differences(fingerprints) if not d.refused]
    return lines + describe_checks(group_checks(checks, "warn"))


@dataclass(frozen=True)
class ValueGroup:
    value: str
    count: int
    nodes: Tuple[int, ...]


@dataclass(frozen=True)
class Finding:
    check: msg.PreflightCheck
    count: int
    nodes: Tuple[int, ...]


@dataclass(frozen=True)
class JobRecord(Written):
    """``preflight="full"``'s collective job, as rank 0 returned it, checked."""

    backend: str = "?"
    allreduce_ok: bool = False
    busbw_gbps: Optional[float] = None
    size_mib: Optional[int] = None
    home_node: int = 0
    link_gbps: Dict[int, float] = field(default_factory=dict)
    link_median_gbps: float = 0.0
    init_s: Dict[int, float] = field(default_factory=dict)
    slow: Tuple[int, ...] = ()
    seconds: float = 0.0


@dataclass(frozen=True)
class PreflightRecord:
    """What the result record, the task metadata and the card keep."""

    mode: str
    nodes: int = 0
    reported: int = 0
    versions: Dict[str, Tuple[ValueGroup, ...]] = field(default_factory=dict)
    differences: Tuple[str, ...] = ()
    findings: Tuple[Finding, ...] = ()
    # The card's table: nodes with a problem first, a cell per check.
    rows: Tuple[Dict[str, Union[int, str]], ...] = ()
    job: Optional[JobRecord] = None

    def to_wire(self) -> Dict[str, Any]:
        """Hand-written: the mode alone where nothing was compared, and each finding's check flattened."""
        data: Dict[str, Any] = {"mode": self.mode}
        if self.reported or self.rows or self.versions:
            data.update({
                "nodes": self.nodes,
                "reported": self.reported,
                "versions": {name: [{"value": g.value, "count": g.count, "nodes": list(g.nodes)} for g in groups]
                             for name, groups in self.versions.items()},
                "differences": list(self.differences),
                "findings": [dict(f.check.to_wire(), count=f.count, nodes=list(f.nodes)) for f in self.findings],
                "rows": [dict(r) for r in self.rows],
            })
        if self.job is not None:
            data["job"] = self.job.to_wire()
        return data


def record(fingerprints: Fingerprints, checks: Checks, num_nodes: int, mode: str) -> PreflightRecord:
    versions: Dict[str, Tuple[ValueGroup, ...]] = {}
    for name, by_value in group_values(fingerprints).items():
        ordered = sorted(by_value.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
        versions[name] = tuple(ValueGroup(v, len(n), tuple(n[:MAX_LISTED])) for v, n in ordered[:MAX_GROUPS])
    findings = [Finding(check, len(nodes), tuple(nodes[:MAX_LISTED])) for status in ("fail", "warn")
                for check, nodes in group_checks(checks, status)[:4 * MAX_GROUPS]]
    return PreflightRecord(
        mode=mode, nodes=num_nodes, reported=len(fingerprints), versions=versions,
        differences=tuple(d.describe() for d in differences(fingerprints))[:len(msg.FINGERPRINT_FIELDS)],
        findings=tuple(findings), rows=tuple(rows(fingerprints, checks)))


def rows(fingerprints: Fingerprints, checks: Checks) -> List[Dict[str, Union[int, str]]]:
    """The card's table: nodes with a problem first; a cell: the status and, if not ok, what was found."""
    odd: Dict[int, List[str]] = {}
    for d in differences(fingerprints):
        for _, group in d.others:
            for n in group:
                odd.setdefault(n, []).append(d.field)
    nodes = sorted(set(fingerprints) | set(checks), key=lambda n: (
        not (n in odd or any(c.status != "ok" for c in checks.get(n, ()))), n))
    out: List[Dict[str, Union[int, str]]] = []
    for node in nodes[:MAX_ROWS]:
        versions = "differ: " + ", ".join(odd[node]) if node in odd else "ok"
        row: Dict[str, Union[int, str]] = {"node": node, "versions": versions[:ROW_TEXT]}
        for check in checks.get(node, ()):
            cell = check.status if check.status == "ok" else "%s: %s" % (check.status, check.found)
            row[check.name] = cell[:ROW_TEXT]
        out.append(row)
    return out


class PreflightBook:
    """The nodes' preflight messages, compared once, when the last one arrives."""

    def __init__(self, num_nodes: int):
        self.num_nodes = num_nodes
        self.fingerprints: Dict[int, Dict[str, str]] = {}
        self.checks: Dict[int, Tuple[msg.PreflightCheck, ...]] = {}
        self.decided = False

    def keep(self, node: int, message: msg.Preflight) -> bool:
        """True when this was the last node's."""
        if node in self.fingerprints:
            raise msg.ProtocolError("node %d sent its preflight twice" % node)
        self.fingerprints[node] = dict(message.versions)
        self.checks[node] = tuple(message.checks)
        if len(self.fingerprints) == self.num_nodes and not self.decided:
            self.decided = True
            return True
        return False

    def again(self, node: int, message: msg.Preflight) -> Optional[Cause]:
        """A lost node back with a new task: its fingerprint and checks replace its old ones, and the
        gang's verdict on them (a cause: it must not train)."""
        self.fingerprints[node] = dict(message.versions)
        self.checks[node] = tuple(message.checks)
        return self.verdict() if self.decided else None

    def verdict(self) -> Optional[Cause]:
        return verdict(self.fingerprints, self.checks)

    def unfit(self) -> List[int]:
        return unfit(self.fingerprints, self.checks)

    def warnings(self) -> List[str]:
        return warnings(self.fingerprints, self.checks)

    def record(self, mode: str) -> PreflightRecord:
        return record(self.fingerprints, self.checks, self.num_nodes, mode)


# preflight="full"'s job: a node whose link to rank 0's node is under this fraction of the median is slow.
SLOW_FRACTION = 0.5


def _numbers(value: Any) -> Dict[int, float]:
    """node -> a finite non-negative number; anything else left out."""
    items = list(value.items())[:1 << 20] if isinstance(value, Mapping) else []
    return {k: float(v) for k, v in items
            if isinstance(k, int) and isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e12}


def job_record(returned: Any, took: float) -> JobRecord:
    """What rank 0 of the job returned, checked, with the slow nodes named."""
    data = returned if isinstance(returned, Mapping) else {}
    links = _numbers(data.get("link_gbps"))
    init = _numbers(data.get("init_s"))
    mid = statistics.median(links.values()) if links else 0.0
    slow = sorted(n for n, v in links.items() if len(links) >= 2 and v < SLOW_FRACTION * mid)
    busbw = data.get("busbw_gbps")
    size = data.get("size_mib")
    home = data.get("home_node")
    return JobRecord(
        backend=str(data.get("backend", "?"))[:16],
        allreduce_ok=data.get("allreduce_ok") is True,
        busbw_gbps=float(busbw) if isinstance(busbw, (int, float)) and not isinstance(busbw, bool) else None,
        size_mib=size if isinstance(size, int) and not isinstance(size, bool) else None,
        home_node=home if isinstance(home, int) and not isinstance(home, bool) else 0,
        link_gbps=links, link_median_gbps=round(mid, 3), init_s=init, slow=tuple(slow), seconds=round(took, 3))


def describe_job(job: JobRecord) -> List[str]:
    slowest = max(job.init_s.items(), key=lambda kv: kv[1]) if job.init_s else None
    lines = ["collective job (%s) in %.1fs: all-reduce %s, bus bandwidth %s GB/s%s" % (
        job.backend, job.seconds, "ok" if job.allreduce_ok else "WRONG SUM",
        "%.3g" % job.busbw_gbps if job.busbw_gbps is not None else "?",
        ", process-group init up to %.2fs (node %d)" % (slowest[1], slowest[0]) if slowest else "")]
    for node in job.slow:
        lines.append("node %d is slow: %.3g GB/s to node %d, under %d%% of the median %.3g GB/s. Fix: check that "
                     "node's network link (NIC, cable, placement) or leave it out" % (
                         node, job.link_gbps.get(node, 0.0), job.home_node, SLOW_FRACTION * 100,
                         job.link_median_gbps))
    return lines
