"""Who is in the gang, and who is still alive.

Joins are counted, never listed to anyone. On a local run a node task that
ended before its node joined ends the gang at once, named with its exit and
last lines, rather than being waited for until ``start_timeout``. The scans
here are O(nodes) and run at the check rate, never once per message.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Mapping, NamedTuple, Optional, Set, Tuple

from ..cause import Cause, CauseKind, plural
from ..errors import LAST_LINES_HEAD
from ..procs.failures import describe_exit_code
from .config import CONTROL_NODE, GangConfig
from .peer import Peer
from .silence import silence_cause


class NodeEnd(NamedTuple):
    exit_code: int
    last_lines: Tuple[str, ...] = ()


class Membership:
    def __init__(self, config: GangConfig) -> None:
        self.config = config
        self.by_node: Dict[int, Peer] = {}  # node -> its one authenticated connection
        self.joined_at: Dict[int, float] = {}  # node -> epoch seconds of its first join
        self.left: Dict[int, Tuple[int, bool]] = {}  # node -> (calls made, ended fine)
        self.hosts: Dict[int, str] = {}  # node -> the host it said it is on (kept after it leaves)
        self.ended: Dict[int, NodeEnd] = {}  # node -> its task's end, seen before it joined
        # node -> when its task was lost and the gang went on without it (it may come back: a pod re-created)
        self.gone: Dict[int, float] = {}
        self.returned: Set[int] = set()  # nodes that joined again after they were lost
        self.started = time.monotonic()

    def taken(self, node: int) -> bool:
        return node in self.by_node or node in self.left

    def join(self, node: int, peer: Peer) -> None:
        if self.gone.pop(node, None) is not None:
            self.returned.add(node)
        peer.node = node
        self.by_node[node] = peer
        self.hosts[node] = peer.host
        self.joined_at.setdefault(node, time.time())

    @property
    def all_joined(self) -> bool:
        return len(self.joined_at) == self.config.num_nodes

    def all_left(self, now: float) -> bool:
        """Every node left its step, or was lost and has not come back within ``start_timeout`` (a node
        the platform starts again takes that long at most to join, as at the step's start)."""
        if len(self.left) + len(self.gone) < self.config.num_nodes:
            return False  # the common case, O(1): someone is still in its step
        back_by = self.config.start_timeout
        return all(n in self.left or now - self.gone[n] > back_by for n in range(self.config.num_nodes))

    @property
    def all_heard(self) -> bool:
        """Every node joined, or its task ended before it could."""
        return len(self.joined_at.keys() | self.ended.keys()) == self.config.num_nodes

    def missing(self) -> List[int]:
        return [n for n in range(self.config.num_nodes) if n not in self.joined_at]

    def saw_ends(self, node_ends: Optional[Callable[[], Mapping[int, NodeEnd]]]) -> Optional[Cause]:
        """The cause for the lowest node whose task ended before it joined, or None."""
        if node_ends is None or self.all_heard:
            return None
        ends = node_ends()
        for node in sorted(ends):
            if node not in self.joined_at and 0 <= node < self.config.num_nodes:
                self.ended.setdefault(node, ends[node])
        if not self.ended:
            return None
        node = min(self.ended)
        end = self.ended[node]
        lines = [line for line in end.last_lines if line.strip()]
        said = ("%s\n%s" % (LAST_LINES_HEAD, "\n".join("    " + line for line in lines))) if lines else \
            "it wrote nothing on stderr"
        return Cause(CauseKind.NODE_LOST, "node %d's task ended before it joined the gang (%s)"
                     % (node, describe_exit_code(end.exit_code)), node_index=node, exit_code=end.exit_code,
                     message=said)

    def lost(self, peer: Peer) -> bool:
        """True when the node had not left its step (its task died)."""
        node = peer.node
        if node is None or self.by_node.get(node) is not peer:
            return False
        del self.by_node[node]
        return node not in self.left

    def never_joined(self, now: float) -> Optional[Cause]:
        if self.all_joined or now - self.started <= self.config.start_timeout:
            return None
        missing, n = self.missing(), self.config.num_nodes
        return Cause(CauseKind.NEVER_JOINED, "%s did not join within %gs (%d of %d joined)"
                     % (plural(missing), self.config.start_timeout, n - len(missing), n), missing=tuple(missing))

    def silent(self, now: float) -> Optional[Cause]:
        limit = self.config.heartbeat_timeout
        quiet = {node: now - peer.last_seen for node, peer in self.by_node.items() if node not in self.left}
        if not any(q > limit for q in quiet.values()):
            return None
        hosts = {node: self.by_node[node].host for node in quiet}
        return silence_cause(quiet, hosts, limit, CONTROL_NODE)

    def waiting(self, now: float) -> Optional[str]:
        if self.all_joined:
            return None
        missing, n = self.missing(), self.config.num_nodes
        return "waiting for nodes: %d/%d joined; %s missing for %.0f s" % (
            n - len(missing), n, plural(missing), now - self.started)
