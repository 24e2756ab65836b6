"""Each node of an attempt, as the node history needs it: where it ran and
what part it had in the attempt's end.

Roles: ``culprit`` (its rank failed, or its preflight refused it), ``lost``
(its task died or never joined), ``frozen`` (it fell silent), ``out`` (taken
out for a spare, ``@torchrun(spares)``: a failure pinned to it, or its
preflight found it unfit), ``slow`` (named by the preflight's bandwidth job or
by straggler detection) and ``bystander`` (the rest). The record keeps every node of the attempt up to ``MAX_NODES``;
beyond that only the nodes with a role other than bystander, and a count.

Pure functions over typed records; the host names come from the gang's own
hello messages (no call to any platform), the instance facts from Metaflow's
own task metadata, read by the client when asked (record/node_history.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..cause import Cause, CauseKind
from ..base.codec import NEED, SKIP, Int, Lenient, OneOf, Text

CULPRIT = "culprit"
LOST = "lost"
FROZEN = "frozen"
OUT = "out"
SLOW = "slow"
BYSTANDER = "bystander"
ROLES = (CULPRIT, LOST, FROZEN, OUT, SLOW, BYSTANDER)
# Roles that blame the node for a failure (the history's "culprit" count): a
# node taken out for a spare counts as a failure pinned to it, though the step
# went on; a slow node is not to blame for a failure.
BLAMED = (CULPRIT, LOST, FROZEN, OUT)
# Nodes kept per attempt with every field; above it, only nodes with a role.
MAX_NODES = 1024
MAX_HOST = 255

_LOST_KINDS = (CauseKind.NODE_LOST, CauseKind.LEFT_EARLY, CauseKind.NEVER_JOINED)
_FROZEN_KINDS = (CauseKind.UNRESPONSIVE,)
# The failure was not a node's: no node is blamed.
_NOBODY = (CauseKind.INTERRUPTED, CauseKind.PREEMPTED, CauseKind.HANG, CauseKind.CALL_MISMATCH,
           CauseKind.CALL_TIMEOUT, CauseKind.STEP_FAILED)


@dataclass(frozen=True)
class NodeEntry(Lenient):
    """One node of one attempt (none without its node and role)."""

    WIRE_ORDER = ("node", "host", "role", "link_gbps", "ratio", "task", "checks")
    node: Annotated[int, Int(0, (1 << 20) - 1)]
    host: Annotated[str, Text(MAX_HOST, least=1)] = "?"
    role: Annotated[str, OneOf(ROLES), NEED] = BYSTANDER
    # preflight="full": GB/s to the reference node; the checks that did not pass.
    link_gbps: Annotated[Optional[float], SKIP] = None
    checks: Annotated[str, Text(200), SKIP] = ""
    # How much slower than the gang's median (straggler detection), if slow.
    ratio: Annotated[Optional[float], SKIP] = None
    # Its Metaflow task's id, for the platform's facts in its metadata
    # (instance ID, zone, type): kept for nodes with a role only.
    task: Annotated[Optional[str], Text(200), SKIP] = None


def blamed_nodes(cause: Optional[Cause], code_failure: bool) -> Dict[int, str]:
    """node -> role for the nodes a cause names. A failure of the user's own
    code (``code_failure``) blames no node: the code would fail anywhere."""
    if cause is None or cause.secondary or code_failure or cause.kind in _NOBODY:
        return {}
    if cause.kind in _LOST_KINDS:
        role = LOST
    elif cause.kind in _FROZEN_KINDS:
        role = FROZEN
    else:
        role = CULPRIT
    nodes = set(cause.missing)
    if cause.node_index is not None:
        nodes.add(cause.node_index)
    return {n: role for n in nodes if isinstance(n, int) and n >= 0}


def entries(num_nodes: int, hosts: Mapping[int, str], blamed: Mapping[int, str], slow: Mapping[int, float],
            links: Mapping[int, float], failed_checks: Mapping[int, str],
            tasks: Sequence[str] = (), taken_out: Iterable[int] = ()) -> Tuple[Tuple[NodeEntry, ...], int]:
    """Every node of the attempt (``MAX_NODES`` at most: beyond that the
    bystanders are only counted), and how many were left out. ``taken_out``:
    the nodes benched out for a spare (at most the step's ``spares``)."""
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


def stragglers(progress: Any) -> Dict[int, float]:
    """node -> how much slower, from a result's ``progress`` section when
    straggler detection wrote one (absent otherwise)."""
    listed = progress.get("stragglers") if isinstance(progress, Mapping) else getattr(progress, "stragglers", None)
    out: Dict[int, float] = {}
    for item in (listed if isinstance(listed, (list, tuple)) else [])[:MAX_NODES]:
        get = item.get if isinstance(item, Mapping) else (lambda k, i=item: getattr(i, k, None))
        node, ratio = get("node_index"), get("ratio")
        if isinstance(node, int) and not isinstance(node, bool) and node >= 0:
            out[node] = float(ratio) if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) else 0.0
    return out


def hosts_of(nodes: Iterable[NodeEntry]) -> Dict[int, str]:
    return {n.node: n.host for n in nodes}

