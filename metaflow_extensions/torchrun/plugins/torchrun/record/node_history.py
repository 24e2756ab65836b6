"""Node history across runs: which hosts failed, how often, and why.

Read through the Metaflow client from a flow's last runs' records, it says which
hosts were culprits or stragglers and which causes recurred (``python flow.py
torchrun history``), and lets the preflight warn about a host blamed in K of
its last M appearances, or refuse it under ``preflight="strict"``.

What is blamed is what failed. A node with a host of its own (each pod's
Kubernetes node, each Batch instance, each named test host) is its host: the
machine is what a next attempt can avoid. Nodes that share one host in an
attempt (every node of a local run) are told apart by their index, as
``vm (node 1)``, in what the history shows: a failure of node 1 says nothing
of nodes 0 and 2. The preflight checks neither: on a cluster a shared host is
one machine (two pods on one bad Kubernetes node), and on a local run the
nodes that share this machine are not checked at all, since an index names
no machine (node 1 killed in a test run is not node 1 of the next).
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .. import load_order  # noqa: F401  (Metaflow first, whatever the user imports first)
from metaflow import Flow, Metaflow
from metaflow.exception import MetaflowNotFound

from ..base import defaults as DEFAULTS
from ..cause import Cause, CauseKind
from ..base.codec import LOCAL, Written
from ..gang import HostCheck
from ..base.text import shorten
from .attempts import Attempt, Previous
from .node_roles import BLAMED, CULPRIT, FROZEN, OUT, ROLES, SLOW, mark_role
from .result import METADATA_FIELD

# Hosts named in the preflight's lines and in a refusal.
MAX_FLAGGED = 16


@dataclass(frozen=True)
class Appearance:
    """One node in one attempt of one run, on its host."""

    host: str
    flow: str
    run: str
    step: str
    attempt: int
    role: str
    at: float = 0.0
    cause: Optional[str] = None  # the attempt's stop, when the host was blamed
    link_gbps: Optional[float] = None
    node: Optional[int] = None  # where its host held several nodes of the attempt: which one it was

    @property
    def where(self) -> str:
        return "%s/%s attempt %d" % (self.run, self.step, self.attempt)

    @property
    def key(self) -> str:
        """What the history counts against: the host, or one node of a host several nodes shared."""
        return self.host if self.node is None else slot(self.host, self.node)


def slot(host: str, node: int) -> str:
    return "%s (node %d)" % (host, node)


@dataclass
class HostStats(Written):
    """What the history says of one host (or one node of a shared host: ``key``)."""

    WIRE_ORDER = ("host", "appearances", "blamed", "slow", "roles", "causes", "last_seen", "blamed_in")
    host: str
    appearances: int = 0
    roles: Dict[str, int] = field(default_factory=dict)
    causes: Dict[str, int] = field(default_factory=dict)
    last_seen: float = 0.0
    runs: Annotated[List[str], LOCAL] = field(default_factory=list)  # the runs it was blamed in

    @property
    def blamed(self) -> int:
        return sum(self.roles.get(r, 0) for r in BLAMED)

    @property
    def slow(self) -> int:
        return self.roles.get(SLOW, 0)

    @property
    def blamed_in(self) -> List[str]:
        return self.runs[:10]


_RANK = {r: i for i, r in enumerate(ROLES)}  # culprit first, bystander last


def appearances(attempts: Iterable[Attempt], flow: str, run: str, step: str) -> List[Appearance]:
    """One appearance per node per attempt, from an attempts record: by its host where it had one to
    itself, else by its index on the host it shared."""
    out: List[Appearance] = []
    for a in attempts:
        shared = {h for h, n in Counter(n.host for n in a.nodes).items() if n > 1}
        pinned = pinned_in_step(a)
        for n in a.nodes:
            role, stopped = n.role, taken_out(a, n) if n.role == OUT else a.stopped
            mark = pinned.get(n.node)
            if mark is not None and _RANK[mark[0]] < _RANK.get(role, len(ROLES)):
                role, stopped = mark  # what befell it in the step is worse than how the attempt ended for it
            out.append(Appearance(
                n.host, flow, run, step, a.attempt, role, a.started_at or 0.0,
                cause=shorten(stopped or "", 300) if role in BLAMED else None, link_gbps=n.link_gbps,
                node=n.node if n.host in shared else None))
    return out


# A restart's summary names the node its cause is pinned to first: "node 1 (vm), rank 1 (...): ...",
# "node 1: torchrun ended with ...", "node 2 (vm) disconnected ..." (errors.node_name, runtime/node_report.py,
# gang/handlers.py, gang/silence.py).
_PINNED = re.compile(r"node (\d+)\b")


def pinned_in_step(a: Attempt) -> Dict[int, Tuple[str, str]]:
    """node -> (role, why) of the latest of the attempt's in-step restarts, swaps and losses pinned to it: a
    node restarted in place for its rank's failure, lost and replaced (or the gang went on without it), frozen,
    is as much to blame as one the attempt ended on, though it came back or the step went on. The node is the
    one swapped out, else the one the summary names first; a hang is nobody's (node_roles.mark_role)."""
    found: Dict[int, Tuple[str, str]] = {}
    for mark in a.restarts:
        role = mark_role(mark.kind, mark.swapped_in is not None)
        pinned = _PINNED.match(mark.stopped) if mark.swapped_out is None else None
        node = mark.swapped_out if mark.swapped_out is not None else int(pinned.group(1)) if pinned else None
        if role is None or node is None:
            continue
        how = "taken out for a spare: " if mark.swapped_in is not None else \
            "restarted in place: " if role in (CULPRIT, FROZEN) else ""
        found[node] = (role, how + mark.stopped)
    return found


def taken_out(a: Attempt, node: Any) -> str:
    """Why ``node`` was taken out for a spare: the swap's cause, else its failed preflight checks."""
    for mark in reversed(a.restarts):
        if mark.swapped_out == node.node:
            return "taken out for a spare: %s" % mark.stopped
    return "taken out for a spare before any rank started%s" % (": preflight " + node.checks if node.checks else "")


def summarize(seen: Iterable[Appearance]) -> List[HostStats]:
    """Per key, the most blamed first, then the slowest."""
    stats: Dict[str, HostStats] = {}
    for a in seen:
        s = stats.setdefault(a.key, HostStats(a.key))
        s.appearances += 1
        s.roles[a.role] = s.roles.get(a.role, 0) + 1
        s.last_seen = max(s.last_seen, a.at)
        if a.cause is not None:
            key = cause_key(a.cause)
            s.causes[key] = s.causes.get(key, 0) + 1
            if a.run not in s.runs:
                s.runs.append(a.run)
    return sorted(stats.values(), key=lambda s: (-s.blamed, -s.roles.get(SLOW, 0), -s.appearances, s.host))


def cause_key(stopped: str) -> str:
    """A cause as it recurs: numbers (nodes, ranks, pids, seconds) made ``N``."""
    return shorten(re.sub(r"\d+(\.\d+)?", "N", stopped.split("\n")[0]), 120)


def recurring_causes(seen: Iterable[Appearance]) -> List[Tuple[str, int, List[str]]]:
    """Causes of blamed attempts, most frequent first: (cause, times, hosts)."""
    by: Dict[str, Tuple[set, List[str]]] = {}
    for a in seen:
        if a.cause is None:
            continue
        attempts, hosts = by.setdefault(cause_key(a.cause), (set(), []))
        attempts.add((a.flow, a.run, a.step, a.attempt))
        if a.key not in hosts:
            hosts.append(a.key)
    return sorted(((k, len(v[0]), v[1]) for k, v in by.items()), key=lambda t: (-t[1], t[0]))


def report(seen: Sequence[Appearance]) -> Dict[str, Any]:
    """The history as ``--json`` prints it and the client helper returns it."""
    return {
        "runs": len({(a.flow, a.run) for a in seen}),
        "attempts": len({(a.flow, a.run, a.step, a.attempt) for a in seen}),
        "hosts": [s.to_wire() for s in summarize(seen)],
        "causes": [{"cause": c, "times": n, "hosts": hosts} for c, n, hosts in recurring_causes(seen)],
    }


def history(flow: Optional[str] = None, last: Optional[int] = 20, days: Optional[float] = None) -> Dict[str, Any]:
    """The client helper: ``history("TrainFlow", last=20)`` (``flow`` None: every flow)."""
    return report(read(flow, last=last, days=days))


@dataclass(frozen=True)
class Threshold:
    """A host blamed in ``culprit`` of its last ``appearances`` is flagged."""

    culprit: int = DEFAULTS.NODE_HISTORY_CULPRIT
    appearances: int = DEFAULTS.NODE_HISTORY_APPEARANCES


def evidence(key: str, seen: Sequence[Appearance], threshold: Threshold) -> Optional[str]:
    """Why ``key`` (a host, or a node of a shared one) is flagged, naming the attempts; None when it is not."""
    mine = sorted((a for a in seen if a.key == key), key=lambda a: -a.at)[:threshold.appearances]
    blamed = [a for a in mine if a.role in BLAMED]
    if len(blamed) < threshold.culprit:
        slow = [a for a in mine if a.role == SLOW]  # a straggler the gang waited for, as often: flagged too
        if len(slow) < threshold.culprit:
            return None
        return "%s was named slow in %d of its last %d appearances: %s%s" % (
            key, len(slow), len(mine), "; ".join(a.where for a in slow[:3]), "; ..." if len(slow) > 3 else "")
    named = "; ".join("%s (%s: %s)" % (a.where, a.role, shorten(a.cause or "", 100)) for a in blamed[:3])
    return "%s was blamed in %d of its last %d appearances: %s%s" % (
        key, len(blamed), len(mine), named, "; ..." if len(blamed) > 3 else "")


def slower_than_its_past(host: str, gbps: float, seen: Sequence[Appearance],
                         fraction: float = DEFAULTS.NODE_HISTORY_BANDWIDTH_FRACTION) -> Optional[str]:
    """Why a host's bandwidth now is suspect: under ``fraction`` of its own past median."""
    past = [a.link_gbps for a in seen if a.host == host and a.link_gbps is not None]
    if len(past) < 2:
        return None
    mid = statistics.median(past)
    if gbps >= fraction * mid:
        return None
    return "%s measured %.3g GB/s, under %d%% of its own median %.3g GB/s over %d past runs" % (
        host, gbps, fraction * 100, mid, len(past))


def steering(hosts: Sequence[str], platform: str) -> str:
    """How to keep the next attempt off these hosts, where the platform lets a user."""
    if platform == "kubernetes":
        ips = " ".join(h.split(" ", 1)[1] for h in hosts if h.startswith("node "))
        return ("Metaflow's @kubernetes cannot exclude a node (node_selector matches labels, tolerations only "
                "allow taints); keep new pods off it with a taint, e.g. for each node IP in [%s]: kubectl taint "
                "nodes $(kubectl get nodes -o jsonpath='{.items[?(@.status.addresses[0].address==\"<IP>\")]"
                ".metadata.name}') metaflow-torchrun/suspect=true:NoSchedule" % ips)
    if platform == "batch":
        return ("AWS Batch offers a job no way to avoid an instance: the next attempt may land on it again "
                "(terminate the instance, or drain it from the compute environment)")
    return ""


def check(hosts: Mapping[int, str], seen: Sequence[Appearance], threshold: Optional[Threshold], strict: bool,
          platform: str) -> Tuple[List[str], Optional[Cause]]:
    """The preflight's lines about hosts with a bad history, and under ``strict`` the refusal."""
    if threshold is None or not seen:
        return [], None
    flagged = _flagged(hosts, seen, threshold, platform)[:MAX_FLAGGED]
    if not flagged:
        return [], None
    lines = ["node%s %s: %s" % ("s" if len(nodes) > 1 else "", ", ".join(map(str, nodes[:8])), why)
             for host, nodes, why in flagged]
    advice = steering([h for h, _, _ in flagged], platform)
    if not strict:
        return ["%s (not refused: preflight=\"strict\" would)" % line for line in lines] + (
            [advice] if advice else []), None
    first = flagged[0]
    cause = Cause(CauseKind.PREFLIGHT, "preflight refused the gang before any rank started: node %d: %s"
                  % (first[1][0], first[2]), node_index=first[1][0], message="\n".join(lines + [advice])[:4000])
    return ([advice] if advice else []), cause


def node_keys(hosts: Mapping[int, str], platform: str) -> Dict[int, str]:
    """Each node of a gang the history can check, as it knows it: its host. On a local run, none of the
    nodes that share this machine: their index names no machine (node 1 killed in a test run is not node 1
    of the next), so the history neither warns about them nor starts one as a spare."""
    shared = {h for h, n in Counter(hosts.values()).items() if n > 1} if platform == "local" else set()
    return {node: host for node, host in hosts.items() if host not in shared}


def as_machines(seen: Sequence[Appearance]) -> List[Appearance]:
    """One appearance per host per attempt, its worst role: a cluster's host is one machine, whichever of
    the nodes it held failed."""
    by: Dict[Tuple[str, str, str, str, int], List[Appearance]] = {}
    for a in seen:
        by.setdefault((a.host, a.flow, a.run, a.step, a.attempt), []).append(a)
    return [replace(min(group, key=lambda a: _RANK.get(a.role, len(ROLES))), node=None,
                    link_gbps=next((a.link_gbps for a in group if a.link_gbps is not None), None))
            for group in by.values()]


def _flagged(hosts: Mapping[int, str], seen: Sequence[Appearance], threshold: Threshold,
             platform: str) -> List[Tuple[str, List[int], str]]:
    """(what is flagged, its nodes in this gang, why)."""
    view = seen if platform == "local" else as_machines(seen)  # local: a host shared in the past is no host now
    by_key: Dict[str, List[int]] = {}
    for node, key in sorted(node_keys(hosts, platform).items()):
        by_key.setdefault(key, []).append(node)
    return [(key, nodes, why) for key, nodes in by_key.items()
            for why in [evidence(key, view, threshold)] if why is not None]


def record_attempts(value: Any) -> List[Attempt]:
    try:
        record = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return []
    previous = Previous.from_wire(record)
    return list(previous.attempts) if previous is not None else []


def read_run(run: Any, step_names: Optional[Sequence[str]] = None) -> List[Appearance]:
    """Every appearance in one run: the control tasks' latest records, each with every attempt."""
    out: List[Appearance] = []
    for step in run:
        if step_names is not None and step.id not in step_names:
            continue
        for task in step:
            try:
                value = task.metadata_dict.get(METADATA_FIELD)
            except Exception:  # a task whose metadata cannot be read: skipped
                continue
            if value:
                out.extend(appearances(record_attempts(value), run.parent.id, run.id, step.id))
    return out


def read(flow: Optional[str], last: Optional[int] = None, days: Optional[float] = None,
         skip_run: Optional[str] = None, steps: Optional[Sequence[str]] = None) -> List[Appearance]:
    """The appearances in ``flow``'s last ``last`` runs, or ``days`` (None: every flow), of ``steps``."""
    try:
        flows = [Flow(flow)] if flow is not None else list(Metaflow())
    except MetaflowNotFound:  # no run yet: no history
        return []
    since = time.time() - days * 86400 if days is not None else None
    out: List[Appearance] = []
    for f in flows:
        for i, run in enumerate(f.runs()):
            if (last is not None and i >= last) or (since is not None and run.created_at.timestamp() < since):
                break
            if run.id != skip_run:
                out.extend(read_run(run, steps))
    return out


def platform_of(env: Mapping[str, str]) -> str:
    if env.get("METAFLOW_KUBERNETES_WORKLOAD") or env.get("METAFLOW_KUBERNETES_NODE_IP"):
        return "kubernetes"
    if env.get("AWS_BATCH_JOB_ID"):
        return "batch"
    return "local"


def host_check(read_history: Callable[[], Optional[List[Appearance]]], threshold: Optional[Threshold],
               strict: bool, platform: str) -> HostCheck:
    """What the gang service calls on its thread once every node's preflight is in."""

    def run(hosts: Dict[int, str]) -> Tuple[List[str], Optional[Cause], List[int]]:
        seen = read_history()
        if seen is None:
            return ["the node history was not read in time: this gang's hosts were not checked"], None, []
        lines, cause = check(hosts, seen, threshold, strict, platform)
        return lines, cause, blamed(hosts, seen, threshold, platform)

    return run


def blamed(hosts: Mapping[int, str], seen: Sequence[Appearance], threshold: Optional[Threshold],
           platform: str = "local") -> List[int]:
    """The nodes the history blames: with spares, each starts as a spare (gang/bench.py)."""
    if threshold is None or not seen:
        return []
    return sorted(n for _, nodes, _ in _flagged(hosts, seen, threshold, platform) for n in nodes)
