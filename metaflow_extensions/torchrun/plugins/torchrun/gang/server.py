"""The gang service: one thread in the control task, the one place that sees every
node; each keeps one connection to it for its whole step.

A connection dropped before its node left its step is a dead node (the kernel
closes a dead process's sockets: no timeout); ``heartbeat_timeout`` of silence
a frozen or cut-off one; a reported failure the root cause unless it is an
echo (held ``secondary_grace``). Sends never block, and the O(nodes) scans run
at ``CHECK_PERIOD``; who may speak: ``admission.py``.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..cause import Cause, CauseKind
from . import messages as msg
from .admission import Admission
from .handlers import Handlers
from .calls import CallView
from .config import GangConfig
from .speaker import Speaker
from .membership import NodeEnd
from .peer import Peer
from .node_compare import HostCheck, PreflightRecord
from .gang_progress import ProgressRecord
from .transport import Transport
from .client import GangFacts  # noqa: F401  (the view it offers the control's client; named here too)
from .wire import encode
from ..host.console import say
from ..base import timeouts


class GangServer:
    """The loop, its lock, when heartbeats and checks are due, and the read-only view the control's
    client is built with (``client.GangFacts``); decisions are ``handlers``'."""

    def __init__(self, config: GangConfig, host: str, ports: Sequence[int], secret: bytes, *,
                 progress: Callable[[str], None] = lambda text: None, host_check: Optional[HostCheck] = None,
                 node_ends: Optional[Callable[[], Mapping[int, NodeEnd]]] = None,
                 on_verdict: Optional[Callable[[Cause], None]] = None,
                 on_cut_off: Optional[Callable[[int], None]] = None, warn: Callable[[str], None] = say):
        """Listen on the first of ``ports`` that is free on ``host``. ``progress``: where the gang's
        lines go (joins, progress, stragglers); ``host_check``: the preflight's check of the hosts'
        history; ``node_ends``: a local run's control, the node tasks it started that have ended;
        ``on_verdict``: told the gang's verdict before any node is; ``on_cut_off``: told a silent node the
        gang went on without (a local control kills its processes)."""
        self.config = config
        self.warn = warn
        self.node_ends = node_ends
        self.admission = Admission(config, secret, warn=warn)
        self.transport = Transport(host, ports, config.num_nodes, self.admission,
                                   on_drop=lambda peer: self.handlers.dropped(peer))
        self.handlers = Handlers(config, host, self.admission, self.transport, progress, host_check, on_verdict,
                                 on_cut_off)
        self.speaker = Speaker(config, self.handlers.members.started, progress)
        self._lock = threading.RLock()
        self.port: int = self.transport.port
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="torchrun-gang-server", daemon=True)

    @property
    def cause(self) -> Optional[Cause]:
        return self.handlers.cause

    def hosts(self) -> Dict[int, str]:
        """As each node said when it joined (a node that has left too)."""
        with self._lock:
            return dict(self.handlers.members.hosts)

    def missing(self) -> List[int]:
        with self._lock:
            return self.handlers.members.missing()

    def not_back(self) -> List[int]:
        """Lost, gone on without, not back (a step that ends fine ends without them)."""
        with self._lock:
            members = self.handlers.members
            return sorted(n for n in members.gone if n not in members.left)

    def everyone_heard(self) -> bool:
        """After an abort: every node was told the cause, then or as it joined (or its task ended first)."""
        with self._lock:
            return self.handlers.members.all_heard

    def call_view(self, index: int) -> CallView:
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
        with self._lock:
            return self.handlers.preflight.record(mode)

    def progress_record(self) -> ProgressRecord:
        with self._lock:
            return self.handlers.training.current()

    def linger(self, start_timeout: float) -> None:
        """A failed gang's service stays a little, so a late node learns the cause as it
        joins rather than at ``start_timeout``; not when nodes never joined (they gave up too)."""
        cause = self.cause
        if cause is None or cause.kind is CauseKind.NEVER_JOINED:
            return
        deadline = time.monotonic() + min(timeouts.LINGER, start_timeout)
        while not self.everyone_heard() and time.monotonic() < deadline:
            time.sleep(0.05)

    def start(self) -> "GangServer":
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        self.transport.wake()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.transport.close()

    def _loop(self) -> None:
        self._beat = encode(msg.Heartbeat().to_wire())
        next_beat = next_check = 0.0
        while not self._closing.is_set():
            try:
                next_beat, next_check = self._turn(next_beat, next_check)
            except Exception as e:  # the service outlives any bug of its own
                self.warn("gang service: %s: %s" % (type(e).__name__, e))
                self._closing.wait(timeouts.CHECK_PERIOD)

    def _turn(self, next_beat: float, next_check: float) -> Tuple[float, float]:
        """Returns when the next heartbeat and check are due."""
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
        """A node that has not read what is queued for it learns nothing from one more heartbeat."""
        for peer in list(self.handlers.members.by_node.values()):
            if not peer.outbox:
                self.transport.send(peer, self._beat)
