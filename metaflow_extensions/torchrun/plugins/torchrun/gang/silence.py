"""Who to name when nodes fall silent. From inside a partition the control
cannot tell which side was cut, only the pattern: one worker silent (it is
named), several together (those), or every other node at once (contact lost:
with three or more nodes the control is the likely one cut off).
"""

from __future__ import annotations

from typing import List, Mapping, Optional

from ..cause import Cause, CauseKind, plural

# A node quiet for more than this share of heartbeat_timeout fell silent with
# the one that passed it (a live one is quiet a quarter of it at most).
TOGETHER = 0.5
HOSTS_SHOWN = 4


def silence_cause(quiet: Mapping[int, float], hosts: Mapping[int, str], limit: float,
                  control: int = 0) -> Optional[Cause]:
    """``quiet``: seconds since each connected node still in its step was last heard."""
    overdue = [n for n, q in quiet.items() if q > limit]
    if not overdue:
        return None
    first = max(overdue, key=lambda n: quiet[n])
    workers = [n for n in quiet if n != control]
    together = sorted(n for n in workers if quiet[n] > limit * TOGETHER)
    silence = "%.0fs (heartbeat_timeout=%gs)" % (quiet[first], limit)
    if first == control or first not in together:
        return _one(first, hosts, silence)
    if len(together) == len(workers):
        return _lost_contact(together, hosts, silence, control)
    if len(together) == 1:
        return _one(first, hosts, silence)
    return Cause(CauseKind.UNRESPONSIVE, "%s (%s) sent no heartbeat for %s while the others still answer: frozen or "
                 "cut off from the network" % (plural(together), _hosts(together, hosts), silence),
                 node_index=first, missing=tuple(together))


def _one(node: int, hosts: Mapping[int, str], silence: str) -> Cause:
    return Cause(CauseKind.UNRESPONSIVE, "node %d (%s) sent no heartbeat for %s: frozen or cut off from the network"
                 % (node, hosts.get(node, "?"), silence), node_index=node)


def _lost_contact(silent: List[int], hosts: Mapping[int, str], silence: str, control: int) -> Cause:
    this = "node %d (the control, %s)" % (control, hosts.get(control, "?"))
    if len(silent) == 1:
        (peer,) = silent
        summary = ("lost contact between %s and node %d (%s): no heartbeat from node %d for %s; either node "
                   "is cut off from the network, or node %d is frozen"
                   % (this, peer, hosts.get(peer, "?"), peer, silence, peer))
    else:
        summary = ("lost contact between %s and all %d other nodes at once (%s: no heartbeat for %s): node %d "
                   "is likely the one cut off from the network"
                   % (this, len(silent), plural(silent), silence, control))
    return Cause(CauseKind.UNRESPONSIVE, summary, missing=tuple(silent))


def _hosts(nodes: List[int], hosts: Mapping[int, str]) -> str:
    shown = ", ".join(hosts.get(n, "?") for n in nodes[:HOSTS_SHOWN])
    if len(nodes) > HOSTS_SHOWN:
        shown += " and %d more" % (len(nodes) - HOSTS_SHOWN)
    return shown

