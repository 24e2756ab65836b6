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
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..cause import Cause, CauseKind
from . import messages as msg
from . import restarts
from .ports import find_free_port
from .admission import Admission
from .handlers import MessageHandlers
from .bench import Bench
from .calls import CallBook, CallState, CallView
from .node_compare import HostCheck
from .config import GangConfig
from .speaker import Speaker
from .membership import Membership, NodeEnd
from .peer import Peer
from .node_compare import PreflightBook, PreflightRecord
from .gang_progress import ProgressBook, ProgressRecord
from .transport import Transport
from .wire import encode
from ..host import say
from ..host import log
from .. import timeouts

_log = log.get("gang.server")


Handler = Callable[[Peer, msg.GangMessage], None]


class GangServer(MessageHandlers):
    """Runs in the control task; one thread, one selector, no dependencies.

    State belongs to the service thread. The control's own code reads it only
    through ``call_view``/``stacks_pending`` (copies taken under the lock), or
    hears it as any node does, by message.

    What is here is the loop, the checks and the sending; each message's
    handler is ``handlers.py``'s (a mixin: they share this state), sockets
    ``transport.py``'s, strangers ``admission.py``'s, members
    ``membership.py``'s, calls ``calls.py``'s."""

    def __init__(self, config: GangConfig, host: str, ports: Sequence[int], secret: bytes):
        """Listen on the first of ``ports`` that is free on ``host``; ``secret``
        is the gang's (``secret.py``)."""
        self.config = config
        self.host = host
        self.admission = Admission(config, secret, warn=lambda text: self.warn(text))
        self.members = Membership(config)
        self.book = CallBook(config.num_nodes, Bench.initial(config.num_nodes, config.spares))
        self.preflight = PreflightBook(config.num_nodes)
        self.training = ProgressBook(config.num_nodes, config.straggler_ratio, config.straggler_seconds)
        self.speaker = Speaker(config, self.members.started, lambda text: self.progress(text))
        self.cause: Optional[Cause] = None
        self._pending: Optional[Tuple[Cause, float]] = None  # an echo, held
        self._lock = threading.RLock()
        self.transport = Transport(host, ports, config.num_nodes, self.admission, on_drop=self._on_drop)
        self.port: int = self.transport.port
        self.progress: Callable[[str], None] = lambda text: None
        self.host_check: Optional[HostCheck] = None
        # A local run's control: the node tasks it started that have ended (runtime/node_tasks.py).
        self.node_ends: Optional[Callable[[], Mapping[int, NodeEnd]]] = None
        # Said once per gang: someone without the secret tried to join.
        self.warn: Callable[[str], None] = say
        self._handlers: Dict[msg.MessageType, Handler] = {
            msg.MessageType.HEARTBEAT: self._on_heartbeat,
            msg.MessageType.STACKS: self._on_stacks,
            msg.MessageType.CALL: self._on_call,
            msg.MessageType.CALL_DONE: self._on_call_done,
            msg.MessageType.FAILED: self._on_failed,
            msg.MessageType.LEAVE: self._on_leave,
            msg.MessageType.PREFLIGHT: self._on_preflight,
        }
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="torchrun-gang-server", daemon=True)

    # -- what the control and the tests read -------------------------------------

    @property
    def joined_at(self) -> Dict[int, float]:
        return self.members.joined_at

    @property
    def left(self) -> Dict[int, Tuple[int, bool]]:
        return self.members.left

    @property
    def calls(self) -> Dict[int, CallState]:
        return self.book.calls

    @property
    def rejected(self) -> int:
        return self.admission.rejected

    def hosts(self) -> Dict[int, str]:
        """Each node's host, as it said when it joined (a node that has left too)."""
        with self._lock:
            return dict(self.members.hosts)

    def missing(self) -> List[int]:
        with self._lock:
            return self.members.missing()

    def everyone_heard(self) -> bool:
        """After an abort: every node was told the cause, as it happened (it was
        connected then) or as it joined. A node cut off since is not waited for,
        nor one whose task ended before it joined."""
        with self._lock:
            return self.members.all_heard

    def call_view(self, index: int) -> CallView:
        """A frozen copy of what the gang knows of call ``index``."""
        with self._lock:
            return CallView.of(self.book.calls.get(index), index, self.members.joined_at)

    def stacks_pending(self, index: int) -> List[int]:
        with self._lock:
            return self.book.stacks_pending(index, lambda n: n in self.members.by_node, self.members.left)

    def reports_pending(self, index: int) -> List[int]:
        with self._lock:
            return self.book.reports_pending(index, lambda n: n in self.members.by_node, self.members.left)

    def preflight_record(self, mode: str) -> PreflightRecord:
        """The gang's preflight as the record keeps it (gang/node_compare.py)."""
        with self._lock:
            return self.preflight.record(mode)

    def progress_record(self) -> ProgressRecord:
        """The gang's training progress now, and the stragglers named (gang_progress.py)."""
        with self._lock:
            return self.training.current()

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
                self._handle(peer, line)
            except Exception:  # a malformed message costs its sender, not the gang
                self.transport.drop(peer)
                return

    # -- timeouts and progress -----------------------------------------------------------

    def _check(self, now: float) -> None:
        for peer in self.admission.expired(now):
            self.transport.drop(peer)
        self.transport.resume(now)
        ended = self.members.saw_ends(self.node_ends)  # after an abort too, for everyone_heard
        self._check_stacks()
        if self.cause is None:
            cause = self._overdue(now, ended)
            if cause is not None:
                self._abort(cause)
        self._report_progress(now)

    def _overdue(self, now: float, ended: Optional[Cause] = None) -> Optional[Cause]:
        if self._pending is not None and now >= self._pending[1]:
            return self._pending[0]  # no better cause came: the echo it is
        return (
            ended
            or self.members.never_joined(now)
            or self.book.timed_out(now, self.config.start_timeout)
            or self.book.hung(now, self.config.hang_timeout, self._last_output, self.members.left,
                              advanced=self.training.reporting)
            or self.members.silent(now)
        )

    def _last_output(self, node: int) -> Optional[float]:
        """hang_timeout's clock for a node: when its ranks last advanced a step
        while they report progress, else when they last wrote output."""
        peer = self.members.by_node.get(node)
        if peer is None:
            return None
        return peer.last_advance if peer.last_advance is not None else peer.last_output

    def _report_progress(self, now: float) -> None:
        if self.cause is None:
            self.speaker.tick(now, self.training, lambda: self.members.waiting(now) or self.book.waiting(now))

    # -- sending and ending ----------------------------------------------------------------

    def _abort(self, cause: Cause) -> None:
        """The gang's verdict: a restart of the call's ranks where one is
        allowed (``restarts.py``), else the end, to every node."""
        if self._restart(cause):
            return
        self._pending = None
        self.cause = cause
        _log.debug("verdict: %s (node %s): %s", cause.kind.value, cause.node_index, cause.summary)
        data = encode(msg.Abort(cause).to_wire())
        for peer in list(self.members.by_node.values()):
            self.transport.send(peer, data)

    def _restart(self, cause: Cause) -> bool:
        state = self.book.calls.get(cause.call) if cause.call is not None else None
        if not restarts.may_restart(state, cause, self.config.restarts):
            return False
        assert state is not None
        self._pending = None  # an echo held of the ranks being replaced
        index = restarts.begin(state, find_free_port(self.host), cause)
        swapped = self.book.bench.swap(cause.node_index)  # a spare for the node the cause is pinned to
        swapped_in = None
        if swapped is not None:
            self.book.bench, swapped_in = swapped
        _log.debug("restart %d of call %d (port %s, spare in: %s): %s (node %s): %s", index, state.index,
                   state.rdzv_port, swapped_in, cause.kind.value, cause.node_index, cause.summary)
        data = encode(msg.Restart(state.index, index, state.rdzv_port or 0, cause, self.book.bench,
                                  swapped_in).to_wire())
        for peer in list(self.members.by_node.values()):
            self.transport.send(peer, data)
        return True

    def _heartbeat(self) -> None:
        """To every node with nothing queued: a node that has not read what is
        queued for it learns nothing from one more heartbeat."""
        for peer in list(self.members.by_node.values()):
            if not peer.outbox:
                self.transport.send(peer, self._beat)

    def _send(self, node: int, message: msg.GangMessage) -> None:
        peer = self.members.by_node.get(node)
        if peer is not None:
            self.transport.send(peer, encode(message.to_wire()))

    def _on_drop(self, peer: Peer) -> None:
        """A connection is gone: a node that had not left its step is lost."""
        node = peer.node
        if not self.members.lost(peer) or self.cause is not None or node is None:
            return
        if self._pending is not None and self._pending[0].node_index == node:
            return  # it reported an echo and exited: wait for the grace to decide
        self._abort(Cause(
            CauseKind.NODE_LOST,
            "node %d (%s) disconnected before its step ended: its task died or was killed" % (node, peer.host),
            node_index=node,
        ))
