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
from . import messages as msg
from .bench import Bench
from .config import CONTROL_NODE, GangConfig
from .peer import Peer
from .silence import silence_cause
from .wire import MAX_LINE


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

    def join(self, node: int, peer: Peer, host: str) -> bool:
        """``peer`` proved it is node ``node`` on ``host``: its one connection from now. True when the node
        had been lost and the gang went on without it (a new task of it: it comes back as a spare)."""
        back = self.gone.pop(node, None) is not None
        if back:
            self.returned.add(node)
        peer.node, peer.host = node, host
        peer.reader.max_line = MAX_LINE  # a member's lines may be as long as the protocol allows
        self.by_node[node] = peer
        self.hosts[node] = host
        self.joined_at.setdefault(node, time.time())
        return back

    def probed(self, node: int) -> bool:
        """A member's probe on a fresh connection: as good as hearing it on its own. False: not a member
        (never joined, left, or taken out: a node the gang went on without is heard only as a new task)."""
        member = self.by_node.get(node)
        if member is not None:
            member.last_seen = max(member.last_seen, time.monotonic())
        return member is not None

    @staticmethod
    def heartbeat(peer: Peer, beat: msg.Heartbeat, now: float) -> bool:
        """What a heartbeat says of its node's ranks; True when it names a newer start that saved a snapshot."""
        peer.last_output = None if beat.quiet is None else now - beat.quiet
        progress = beat.progress  # on one heartbeat in PROGRESS_SEND s: the last one holds till then
        if progress is not None:
            peer.last_advance = None if progress.stalled is None or not progress.reporting else now - progress.stalled
        if beat.saved is None or beat.saved == peer.saved:
            return False
        peer.saved = beat.saved
        return True

    @staticmethod
    def new_call(peer: Peer) -> None:
        """Its ranks' steps, if any, count afresh in a new call."""
        peer.last_advance = None

    def leave(self, node: int, made: int, ok: bool) -> None:
        """Its step ended after ``made`` calls; from now on its silence means nothing."""
        self.left[node] = (made, ok)

    def went_on_without(self, node: int) -> None:
        """The gang goes on without ``node``: ``all_left`` waits for it ``start_timeout`` at most."""
        self.gone[node] = time.monotonic()

    def cut_off(self, node: int) -> Optional[Peer]:
        """A silent node the gang goes on without: its connection is no longer its (the service closes it,
        and what it may still send is never read), and it comes back only as a new task."""
        self.went_on_without(node)
        return self.by_node.pop(node, None)

    def all_saved(self, bench: Bench, start: int) -> bool:
        """Every training node's heartbeat says its ranks of ``start`` committed a snapshot. O(nodes): asked
        only while a node waits to come back in (``recovery.wants_regrowth``)."""
        for node in range(self.config.num_nodes):
            if node in bench.benched:
                continue
            peer = self.by_node.get(node)
            if peer is None or peer.saved != start:
                return False
        return True

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
