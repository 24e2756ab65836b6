"""Each node of an attempt: where it ran and its part in the attempt's end.

Roles: ``culprit`` (its rank failed, or its preflight refused it), ``lost``
(its task died or never joined), ``frozen`` (it fell silent), ``out`` (taken
out for a spare: a failure pinned to it, or its preflight found it unfit),
``slow`` (the preflight's bandwidth job or straggler detection named it) and
``bystander``. Hosts are named by the gang's hello messages, not a platform.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..cause import Cause, CauseKind
from ..base.codec import NEED, SKIP, Int, Lenient, OneOf, Text
from ..gang import ProgressRecord

CULPRIT = "culprit"
LOST = "lost"
FROZEN = "frozen"
OUT = "out"
SLOW = "slow"
BYSTANDER = "bystander"
ROLES = (CULPRIT, LOST, FROZEN, OUT, SLOW, BYSTANDER)
# Roles the history counts against a host: taken out for a spare is a failure
# pinned to it, though the step went on; slow is not a failure.
BLAMED = (CULPRIT, LOST, FROZEN, OUT)
# Nodes kept per attempt with every field; above it, only nodes with a role.
MAX_NODES = 1024
MAX_HOST = 255

_LOST_KINDS = (CauseKind.NODE_LOST, CauseKind.LEFT_EARLY, CauseKind.NEVER_JOINED)
_FROZEN_KINDS = (CauseKind.UNRESPONSIVE,)
# The failure was not a node's: no node is blamed.
_NOBODY = (CauseKind.INTERRUPTED, CauseKind.PREEMPTED, CauseKind.HANG, CauseKind.CALL_MISMATCH,
           CauseKind.CALL_TIMEOUT, CauseKind.STEP_FAILED, CauseKind.REGROWN)


@dataclass(frozen=True)
class NodeEntry(Lenient):
    """One node of one attempt (none without its node and role)."""

    WIRE_ORDER = ("node", "host", "role", "link_gbps", "ratio", "task", "checks")
    node: Annotated[int, Int(0, (1 << 20) - 1)]
    host: Annotated[str, Text(MAX_HOST, least=1)] = "?"
    role: Annotated[str, OneOf(ROLES), NEED] = BYSTANDER
    # GB/s to the reference node (preflight="full"), the checks it failed,
    # how much slower than the median if slow, and (a node with a role only)
    # its Metaflow task's id, whose metadata has the instance's facts.
    link_gbps: Annotated[Optional[float], SKIP] = None
    checks: Annotated[str, Text(200), SKIP] = ""
    ratio: Annotated[Optional[float], SKIP] = None
    task: Annotated[Optional[str], Text(200), SKIP] = None


def blamed_nodes(cause: Optional[Cause], code_failure: bool) -> Dict[int, str]:
    """node -> role for the nodes a cause names; none for the user's own code (it fails anywhere)."""
    if cause is None or cause.secondary or code_failure or cause.kind in _NOBODY:
        return {}
    role = LOST if cause.kind in _LOST_KINDS else FROZEN if cause.kind in _FROZEN_KINDS else CULPRIT
    nodes = set(cause.missing) | ({cause.node_index} if cause.node_index is not None else set())
    return {n: role for n in nodes if isinstance(n, int) and n >= 0}


def mark_role(kind: Optional[CauseKind], swapped: bool) -> Optional[str]:
    """The role an in-step restart, swap or loss of this kind gives the node it is pinned to (node_history.py):
    lost or frozen as at an attempt's end; a rank's failure makes it the culprit, or ``out`` where a spare
    took its place; a straggler swapped out was slow; None where it is nobody's (a hang, a regrowth)."""
    if kind in _LOST_KINDS:
        return LOST
    if kind in _FROZEN_KINDS:
        return FROZEN
    if kind is CauseKind.RANK_FAILED:
        return OUT if swapped else CULPRIT
    return SLOW if kind is CauseKind.STRAGGLER else None


def entries(num_nodes: int, hosts: Mapping[int, str], blamed: Mapping[int, str], slow: Mapping[int, float],
            links: Mapping[int, float], failed_checks: Mapping[int, str],
            tasks: Sequence[str] = (), taken_out: Iterable[int] = ()) -> Tuple[Tuple[NodeEntry, ...], int]:
    """Every node of the attempt, and the count left out: over ``MAX_NODES``, bystanders are counted."""
    out: List[NodeEntry] = []
    left_out = 0
    benched = set(taken_out)
    for node in range(num_nodes):
        role = blamed.get(node) or (OUT if node in benched else SLOW if node in slow else BYSTANDER)
        if num_nodes > MAX_NODES and role == BYSTANDER:
            left_out += 1
            continue
        task = tasks[node].rsplit("/", 1)[-1] if role != BYSTANDER and node < len(tasks) else None
        out.append(NodeEntry(node=node, host=(hosts.get(node) or "?")[:MAX_HOST], role=role,
                             link_gbps=links.get(node), checks=failed_checks.get(node, "")[:200],
                             ratio=slow.get(node) or None, task=task))
    return tuple(out), left_out


def stragglers(progress: Optional[ProgressRecord]) -> Dict[int, float]:
    """node -> how much slower, as straggler detection named it."""
    return {s.node_index: s.ratio for s in progress.stragglers} if progress is not None else {}

