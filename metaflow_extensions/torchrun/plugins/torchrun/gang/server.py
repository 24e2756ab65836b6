"""The gang service: one thread in the control task that every node of the step
keeps one connection to, from the first line of its step to the last.

What it decides, and why it can: it is the one place that sees every node.

- A node whose connection drops before it left its step died: the gang stops
  at once (the kernel closes a dead process's sockets; no timeout involved).
- A node that sends nothing for ``heartbeat_timeout`` is frozen or cut off.
- Nodes missing after ``start_timeout`` never started; on a local run, a node
  whose task the control saw end before it joined (``node_ends``) is named at once.
- A node that reports a failure (its step raised, or its ranks failed) is the
  root cause, unless it is an echo of another failure (held ``secondary_grace``
  in case the real one follows).
- ``current.torch.run`` calls are matched across nodes (``calls.py``).

Who may speak: only a peer that proved it holds the gang's secret
(``admission.py``), and then only for the node index it proved. A peer that
breaks a rule (a line that is not JSON, a message out of turn, a field of the
wrong type) is dropped: never the service.

Cost per node is constant: no message lists the gang's nodes, each message
goes to the nodes that need it (a verdict to every node once; "all done" and
"all left" to the control only), sends never block (``peer.py``), and the
O(nodes) scans run at ``CHECK_PERIOD``, not once per message.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from ..cause import Cause
from . import messages as msg
from .admission import Admission
from .handlers import Handlers
from .calls import CallState, CallView
from .node_compare import HostCheck
from .config import GangConfig
from .speaker import Speaker
from .membership import Membership, NodeEnd
from .peer import Peer
from .node_compare import PreflightRecord
from .gang_progress import ProgressBook, ProgressRecord
from .transport import Transport
from .wire import encode
from ..host import say
from ..base import timeouts


class GangFacts(Protocol):
    """What the control's own code reads of the gang, and the one way it reads
    it (``runtime/``): each a copy taken under the service's lock, so a read
    never sees a message half handled. Everything else it hears as any node
    does, by message."""

    def hosts(self) -> Dict[int, str]: ...

    def missing(self) -> List[int]: ...

    def call_view(self, index: int) -> CallView: ...

    def stacks_pending(self, index: int) -> List[int]: ...

    def reports_pending(self, index: int) -> List[int]: ...

    def preflight_record(self, mode: str) -> PreflightRecord: ...

    def progress_record(self) -> ProgressRecord: ...


class GangServer:
    """Runs in the control task; one thread, one selector, no dependencies.

    What is here is the loop: its thread and lock, when heartbeats and checks
    are due, and the control's reads (``GangFacts``). What the gang decides
    from each line, drop and check is its ``handlers``' (``handlers.py``),
    which own the gang's state; sockets are ``transport.py``'s, strangers
    ``admission.py``'s, what the control says while all is well
    ``speaker.py``'s."""

    def __init__(self, config: GangConfig, host: str, ports: Sequence[int], secret: bytes):
        """Listen on the first of ``ports`` that is free on ``host``; ``secret``
        is the gang's (``secret.py``)."""
        self.config = config
        self.admission = Admission(config, secret, warn=lambda text: self.warn(text))
        self.transport = Transport(host, ports, config.num_nodes, self.admission,
                                   on_drop=lambda peer: self.handlers.dropped(peer))
        self.handlers = Handlers(config, host, self.admission, self.transport, lambda text: self.progress(text))
        self.speaker = Speaker(config, self.handlers.members.started, lambda text: self.progress(text))
        self._lock = threading.RLock()
        self.port: int = self.transport.port
        self.progress: Callable[[str], None] = lambda text: None
        # A local run's control: the node tasks it started that have ended (runtime/node_tasks.py).
        self.node_ends: Optional[Callable[[], Mapping[int, NodeEnd]]] = None
        # Said once per gang: someone without the secret tried to join.
        self.warn: Callable[[str], None] = say
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="torchrun-gang-server", daemon=True)

    # -- what the tests read of the handlers' state (on the service's thread, or once it is still) --

    @property
    def cause(self) -> Optional[Cause]:
        return self.handlers.cause

    @property
    def members(self) -> Membership:
        return self.handlers.members

    @property
    def training(self) -> ProgressBook:
        return self.handlers.training

    @property
    def joined_at(self) -> Dict[int, float]:
        return self.handlers.members.joined_at

    @property
    def left(self) -> Dict[int, Tuple[int, bool]]:
        return self.handlers.members.left

    @property
    def calls(self) -> Dict[int, CallState]:
        return self.handlers.book.calls

    @property
    def rejected(self) -> int:
        return self.admission.rejected

    @property
    def host_check(self) -> Optional[HostCheck]:
        return self.handlers.host_check

    @host_check.setter
    def host_check(self, check: Optional[HostCheck]) -> None:
        self.handlers.host_check = check

    # -- what the control reads (GangFacts) ---------------------------------------------

    def hosts(self) -> Dict[int, str]:
        """Each node's host, as it said when it joined (a node that has left too)."""
        with self._lock:
            return dict(self.handlers.members.hosts)

    def missing(self) -> List[int]:
        with self._lock:
            return self.handlers.members.missing()

    def everyone_heard(self) -> bool:
        """After an abort: every node was told the cause, as it happened (it was
        connected then) or as it joined. A node cut off since is not waited for,
        nor one whose task ended before it joined."""
        with self._lock:
            return self.handlers.members.all_heard

    def call_view(self, index: int) -> CallView:
        """A frozen copy of what the gang knows of call ``index``."""
        with self._lock:
            return CallView.of(self.handlers.book.calls.get(index), index, self.handlers.members.joined_at)

    def stacks_pending(self, index: int) -> List[int]:
        members = self.handlers.members
        with self._lock:
            return self.handlers.book.stacks_pending(index, lambda n: n in members.by_node, members.left)

    def reports_pending(self, index: int) -> List[int]:
        members = self.handlers.members
        with self._lock:
            return self.handlers.book.reports_pending(index, lambda n: n in members.by_node, members.left)

    def preflight_record(self, mode: str) -> PreflightRecord:
        """The gang's preflight as the record keeps it (gang/node_compare.py)."""
        with self._lock:
            return self.handlers.preflight.record(mode)

    def progress_record(self) -> ProgressRecord:
        """The gang's training progress now, and the stragglers named (gang_progress.py)."""
        with self._lock:
            return self.handlers.training.current()

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> "GangServer":
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        self.transport.wake()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.transport.close()

    # -- the loop ---------------------------------------------------------------------

    def _loop(self) -> None:
        beat = msg.Heartbeat()
        self._beat = encode(beat.to_wire())
        next_beat = next_check = 0.0
        while not self._closing.is_set():
            try:
                next_beat, next_check = self._turn(next_beat, next_check)
            except Exception as e:  # the service outlives any bug of its own
                self.warn("gang service: %s: %s" % (type(e).__name__, e))
                self._closing.wait(timeouts.CHECK_PERIOD)

    def _turn(self, next_beat: float, next_check: float) -> Tuple[float, float]:
        """One turn of the loop; returns when the next heartbeat and check are due."""
        now = time.monotonic()
        events = self.transport.wait(max(0.0, min(next_beat, next_check) - now))
        with self._lock:
            for peer, mask in events:
                if peer is None:
                    return next_beat, next_check  # closing
                self._on_ready(peer, mask)
            now = time.monotonic()
            if now >= next_beat:
                self._heartbeat()
                next_beat = now + self.config.heartbeat_interval
            if now >= next_check:
                self._check(now)
                next_check = now + min(timeouts.CHECK_PERIOD, self.config.heartbeat_interval / 2)
        return next_beat, next_check

    def _on_ready(self, peer: Peer, mask: int) -> None:
        for line in self.transport.ready(peer, mask) or []:
            if peer.sock not in self.transport.peers:
                return
            try:
                self.handlers.handle(peer, line)
            except Exception:  # a malformed message costs its sender, not the gang
                self.transport.drop(peer)
                return

    def _check(self, now: float) -> None:
        for peer in self.admission.expired(now):
            self.transport.drop(peer)
        self.transport.resume(now)
        self.handlers.check(now, self.node_ends)
        if self.handlers.cause is None:
            self.speaker.tick(now, self.handlers.training, lambda: self.handlers.waiting(now))

    def _heartbeat(self) -> None:
        """To every node with nothing queued: a node that has not read what is
        queued for it learns nothing from one more heartbeat."""
        for peer in list(self.handlers.members.by_node.values()):
            if not peer.outbox:
                self.transport.send(peer, self._beat)
