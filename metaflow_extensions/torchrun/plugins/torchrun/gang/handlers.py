"""What the gang service decides from what it hears: each member's message (one
handler per type), a dropped connection, and the checks' timeouts.

``Handlers`` owns the gang's state (members, calls, preflight, progress, the
verdict or an echo held in case a better cause follows); the service
(``server.py``) owns the thread, the lock and the timing, and calls in here."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from ..cause import Cause, CauseKind
from ..host import log
from . import messages as msg
from .admission import Admission
from .bench import Bench
from .calls import CallBook, CallState, begin_restart, in_progress, may_restart
from .config import CONTROL_NODE, GangConfig
from .gang_progress import ProgressBook, duration
from .membership import Membership, NodeEnd
from .node_compare import HostCheck, PreflightBook
from .peer import Peer
from .ports import find_free_port
from .snapshot_directory import address_of, bench_changed, on_entered
from .transport import Transport
from .wire import MAX_LINE, ProtocolError, encode

_log = log.get("gang.server")


class Handlers:
    def __init__(self, config: GangConfig, host: str, admission: Admission, transport: Transport,
                 say: Callable[[str], None], host_check: Optional[HostCheck] = None,
                 on_verdict: Optional[Callable[[Cause], None]] = None) -> None:
        """``host``: where the calls' rendezvous ports are found free; ``on_verdict``: told the verdict
        before any node (a local control's node tasks, whose echoes then wait for the root cause)."""
        self.config = config
        self.host = host
        self.admission = admission
        self.transport = transport
        self.say = say
        self.members = Membership(config)
        self.book = CallBook(config.num_nodes, Bench.initial(config.num_nodes, config.spares))
        self.preflight = PreflightBook(config.num_nodes)
        self.training = ProgressBook(config.num_nodes, config.straggler_ratio, config.straggler_seconds)
        self.host_check = host_check
        self.on_verdict = on_verdict
        self.cause: Optional[Cause] = None  # the gang's verdict
        self.pending: Optional[Tuple[Cause, float]] = None  # an echo, held until then
        self.all_left_said = False
        self._handlers: Dict[msg.MessageType, Callable[[Peer, msg.GangMessage], None]] = {
            msg.MessageType.HEARTBEAT: self._on_heartbeat, msg.MessageType.STACKS: self._on_stacks,
            msg.MessageType.CALL: self._on_call, msg.MessageType.CALL_DONE: self._on_call_done,
            msg.MessageType.FAILED: self._on_failed, msg.MessageType.LEAVE: self._on_leave,
            msg.MessageType.PREFLIGHT: self._on_preflight}

    def handle(self, peer: Peer, line: msg.WireDict) -> None:
        if peer.node is None:
            if line.get("type") == msg.MessageType.PROBE.value:
                self._on_probe(peer, line)
            else:
                self._on_hello(peer, line)
            return
        message = msg.parse(line)
        handler = self._handlers.get(message.TYPE)
        left = peer.node in self.members.left
        if handler is None or left and message.TYPE not in (msg.MessageType.HEARTBEAT, msg.MessageType.STACKS):
            raise ProtocolError("%s is not the service's to hear now" % message.TYPE.value)
        handler(peer, message)

    def _on_hello(self, peer: Peer, line: msg.WireDict) -> None:
        proved = self.admission.hello(peer, line)
        if proved is not None and self.members.taken(proved[0]):
            self.transport.send(peer, encode(msg.Reject("node %d is taken" % proved[0]).to_wire()))
            proved = None
        if proved is None:
            self.transport.flush(peer)
            self.transport.drop(peer)
            return
        node, client_nonce, peer.host = proved
        self.admission.forget(peer)
        back = node in self.members.gone
        self.members.join(node, peer)
        if back:
            self._came_back(node, peer.host)
        peer.reader.max_line = MAX_LINE
        self.admission.welcome(peer, node, client_nonce, self.cause)
        _log.debug("node %d joined from %s (%d of %d)", node, peer.host, len(self.members.by_node),
                   self.config.num_nodes)
        self.transport.flush(peer)
        self.transport.resume(time.monotonic())

    def _on_probe(self, peer: Peer, line: msg.WireDict) -> None:
        """As good as hearing the member on its own connection. A node the gang does not hold is
        refused, unless the gang is over: then it hears why."""
        proved = self.admission.probe(peer, line)
        if proved is not None:
            node, client_nonce = proved
            member = self.members.by_node.get(node)
            if member is not None:
                member.last_seen = max(member.last_seen, time.monotonic())
            if member is not None or self.cause is not None:
                self.admission.welcome(peer, node, client_nonce, self.cause)
            else:
                peer.queue(encode(msg.Reject("node %d is not in the gang" % node).to_wire()))
        self.transport.flush(peer)
        if not peer.outbox:  # else it closes once written, or HELLO_TIMEOUT drops it
            self.transport.drop(peer)

    def _on_heartbeat(self, peer: Peer, message: msg.GangMessage) -> None:
        assert isinstance(message, msg.Heartbeat)
        now = time.monotonic()
        peer.last_output = None if message.quiet is None else now - message.quiet
        if message.saved is not None and message.saved != peer.saved:
            peer.saved = message.saved
            self._regrow_if_due()
        progress = message.progress  # on one heartbeat in PROGRESS_SEND s: the last one holds till then
        if progress is not None and peer.node is not None:
            peer.last_advance = None if progress.stalled is None or not progress.reporting else now - progress.stalled
            self.training.update(peer.node, peer.host, progress)

    def _on_stacks(self, peer: Peer, message: msg.GangMessage) -> None:
        assert isinstance(message, msg.Stacks) and peer.node is not None
        state = self.book.keep_stacks(peer.node, message)
        # The benched nodes have no ranks: counted once, whether or not they sent (empty) stacks.
        benched = sum(1 for n in self.book.bench.benched if n in state.entries and n not in state.stacks)
        if not state.stacks_in_said and len(state.stacks) + len(state.done) + benched >= len(state.entries):
            self._stacks_in(state)  # the last node's: by count, O(1) (a node gone is found at the check)

    def _owe_stacks(self, index: int) -> List[int]:
        """Not the lost or frozen node the gang stopped for."""
        cause = self.cause
        silent = {cause.node_index, *cause.missing} if cause is not None and cause.kind in (
            CauseKind.NODE_LOST, CauseKind.UNRESPONSIVE) else set()
        pending = self.book.stacks_pending(index, lambda n: n in self.members.by_node, self.members.left)
        return [n for n in pending if n not in silent]

    def _stacks_in(self, state: CallState) -> None:
        state.stacks_in_said = True
        self._broadcast(msg.StacksIn(state.index))

    def _on_call(self, peer: Peer, message: msg.GangMessage) -> None:
        assert isinstance(message, msg.Call) and peer.node is not None
        rejoined = peer.node in self.members.returned and message.index in self.book.calls and \
            peer.node in self.book.calls[message.index].went
        state, cause = self.book.enter(peer.node, message, self.members.left)
        peer.last_advance = None  # a new call: its ranks' steps, if any, count afresh
        self._snapshot_store(peer, peer.node, state, message.snapshot_port)
        if rejoined and cause is None and self.cause is None:
            self._rejoin_call(peer.node, state)
            return
        _log.debug("node %d entered call %d", peer.node, message.index)
        if len(state.entries) == 1:
            self.training.new_call()
        if self.cause is not None:
            return
        if cause is not None:
            self.abort(cause)
            return
        if self.config.spares and self.preflight.fingerprints and not self.preflight.decided:
            return  # the go waits for the preflight's verdict, which may bench an unfit node (_bench_unfit)
        self._launch(state)

    def _snapshot_store(self, peer: Peer, node: int, state: CallState, port: Optional[int]) -> None:
        try:
            address = address_of(peer.sock.getpeername(), port)
        except OSError:
            address = None
        if address is None:
            return
        state.stores[node] = address
        for told, message in on_entered(state.index, node, state.stores, self.book.bench, self.config.num_nodes):
            self._send(told, message)

    def _launch(self, state: CallState) -> None:
        for node in self.book.to_launch(state, lambda: find_free_port(self.host)):
            self._send(node, msg.Go(state.index, state.rdzv_port or 0, self.book.bench))
            _log.debug("call %d: go to node %d (rendezvous port %s)", state.index, node, state.rdzv_port)

    def _on_call_done(self, peer: Peer, message: msg.GangMessage) -> None:
        assert isinstance(message, msg.CallDone) and peer.node is not None
        node = peer.node
        state = self.book.finish(node, message, lambda done: self.admission.check_payload(node, done))
        active = self.book.bench.active_count(self.config.num_nodes)
        _log.debug("call %d: node %d done (%d of %d)", state.index, node, len(state.done), active)
        if len(state.done) == active:  # the benched nodes wait for it too: they never send a done
            for told in (CONTROL_NODE,) + self.book.bench.benched:
                self._send(told, msg.CallAllDone(state.index))

    def _on_failed(self, peer: Peer, message: msg.GangMessage) -> None:
        assert isinstance(message, msg.Failed) and peer.node is not None
        if message.call is not None and message.call in self.book.calls:
            if message.restart < self.book.calls[message.call].restart:
                return  # of ranks a restart already replaced: the new ones are what counts
            self.book.keep_report(self.book.calls[message.call], peer.node, message.report)
        if self.cause is not None:
            return
        cause = message.cause.with_node(peer.node)
        _log.debug("failure seen from node %d%s: %s: %s", peer.node, " (an echo?)" if cause.secondary else "",
                   cause.kind.value, cause.summary)
        if not cause.secondary:
            self.abort(cause)
        elif self.pending is None:
            self.pending = (cause, time.monotonic() + self.config.secondary_grace)

    def _on_preflight(self, peer: Peer, message: msg.GangMessage) -> None:
        """The last one decides, before its node can send the ``call`` that would launch it, so before any
        rank starts. With spares the other nodes' go waits for it too: the verdict may change the bench."""
        assert isinstance(message, msg.Preflight) and peer.node is not None
        if peer.node in self.members.returned and peer.node in self.preflight.fingerprints:
            self._back_unfit(peer.node, self.preflight.again(peer.node, message))
            return
        if not self.preflight.keep(peer.node, message) or self.cause is not None:
            return
        cause = self.preflight.verdict()
        if cause is not None and not self._bench_unfit(self.preflight.unfit(), cause):
            self.abort(cause)
            return
        for line in self.preflight.warnings():
            self.say("preflight: " + line)
        if self.host_check is not None:
            lines, cause, blamed = self.host_check(dict(self.members.hosts))
            for line in lines:
                self.say("preflight: " + line)
            if blamed and self._bench_blamed(blamed):
                cause = None  # no blamed host trains: the gang starts on clean ones
            if cause is not None:
                self.abort(cause)
                return
        for state in list(self.book.calls.values()):  # the calls whose go waited for this verdict (_on_call)
            self._launch(state)

    def _bench_unfit(self, unfit: List[int], cause: Cause) -> bool:
        """The unfit nodes out and spares in, where spares cover them (never node 0)."""
        bench = self.book.bench.take_out(unfit) if unfit and self.book.bench.spares else None
        if bench is None:
            return False
        hosts = self.members.hosts
        for node in unfit:
            self.say("preflight: node %d (%s) taken out before any rank started: %s"
                     % (node, hosts.get(node, "?"), cause.summary.split(": ", 1)[-1]))
        came = [n for n in self.book.bench.spares if n not in bench.spares and n not in bench.out]
        self.say("preflight: spare node%s %s brought in" % ("s" if len(came) > 1 else "", ", ".join(map(str, came))))
        self.book.bench = bench
        return True

    def _bench_blamed(self, blamed: List[int]) -> bool:
        """A blamed host starts as a spare where a clean one exists; True when no blamed node trains."""
        bench = self.book.bench.prefer(blamed)
        for node in blamed:
            if bench.node_rank(node) is None and self.book.bench.node_rank(node) is not None:
                self.say("preflight: node %d (%s) starts as a spare: its host's history (above)"
                         % (node, self.members.hosts.get(node, "?")))
        self.book.bench = bench
        return all(bench.node_rank(n) is None for n in blamed)

    def _on_leave(self, peer: Peer, message: msg.GangMessage) -> None:
        assert isinstance(message, msg.Leave) and peer.node is not None
        node = peer.node
        made = self.book.node_calls.get(node, 0)  # the calls it entered, whatever its leave says
        self.members.left[node] = (made, message.ok)
        _log.debug("node %d left after %d calls (%s)", node, made, "ok" if message.ok else "failed")
        if self.cause is None:
            if not message.ok:
                self.abort(Cause(CauseKind.STEP_FAILED, "node %d ended its step with an error" % node,
                                  node_index=node))
            else:
                cause = self.book.check_left(node, made, self.members.left)
                if cause is not None:
                    self.abort(cause)
        self._all_left(time.monotonic())

    def _all_left(self, now: float) -> None:
        if not self.all_left_said and self.members.all_left(now):
            self.all_left_said = True
            self._send(CONTROL_NODE, msg.AllLeft())

    def dropped(self, peer: Peer) -> None:
        node = peer.node
        if not self.members.lost(peer) or self.cause is not None or node is None:
            return
        if self.pending is not None and self.pending[0].node_index == node:
            return  # it reported an echo and exited: wait for the grace to decide
        cause = Cause(CauseKind.NODE_LOST, "node %d (%s) disconnected before its step ended: its task died or "
                      "was killed" % (node, peer.host), node_index=node)
        if not self._go_on_without(node, cause):
            self.abort(cause)

    def check(self, now: float, node_ends: Optional[Callable[[], Mapping[int, NodeEnd]]]) -> None:
        ended = self.members.saw_ends(node_ends)  # after an abort too, for everyone_heard
        for state in list(self.book.calls.values()):  # stacks in from every node that may still send them
            if state.stacks and not state.stacks_in_said and not self._owe_stacks(state.index):
                self._stacks_in(state)
        if self.cause is None:
            cause = self._overdue(now, ended)
            if cause is not None:
                self.abort(cause)
        if self.members.gone:
            self._all_left(now)
        if self.cause is None and self.config.swap_stragglers is not None:
            self._swap_straggler(self.config.swap_stragglers)

    def _swap_straggler(self, after: float) -> None:
        """The rank the others wait for at the collectives, still so ``after`` seconds after it was first:
        its node swapped for a spare in a restart of the running call (never node 0: it hosts the store)."""
        late, bench = self.training.late, self.book.bench
        if late is None or late.seconds < after or late.node_index == 0 or not bench.spares \
                or late.node_index in bench.benched or not self.book.calls:
            return
        state = self.book.calls[max(self.book.calls)]
        if not in_progress(state, bench.active_count(self.config.num_nodes)) or state.restart >= self.config.restarts:
            return  # a straggler never ends the gang: with no restart left, it trains on
        self.abort(Cause(CauseKind.STRAGGLER, "node %d (%s, ranks %s) has been the one the others wait for at the "
                         "collectives for %s, %.0f ms of every second, each step %.2fx the time it would take "
                         "(swap_stragglers=%gs)" % (late.node_index, late.host, late.ranks, duration(late.seconds),
                                                    late.wait_ms or 0.0, late.ratio, after),
                         node_index=late.node_index, call=state.index))

    def _overdue(self, now: float, ended: Optional[Cause] = None) -> Optional[Cause]:
        if self.pending is not None and now >= self.pending[1]:
            return self.pending[0]  # no better cause came: the echo it is
        return (
            ended
            or self.members.never_joined(now)
            or self.book.timed_out(now, self.config.start_timeout)
            or self.book.hung(now, self.config.hang_timeout, self._last_output, self.members.left,
                              advanced=self.training.reporting)
            or self.members.silent(now)
        )

    def _last_output(self, node: int) -> Optional[float]:
        """hang_timeout's clock: when the ranks last advanced a step while they report progress, else wrote."""
        peer = self.members.by_node.get(node)
        if peer is None:
            return None
        return peer.last_advance if peer.last_advance is not None else peer.last_output

    def waiting(self, now: float) -> Optional[str]:
        return self.members.waiting(now) or self.book.waiting(now)

    def abort(self, cause: Cause) -> None:
        """A restart of the call's ranks where one is allowed, else the end, to every node."""
        if self._restart(cause):
            return
        self.pending = None
        self.cause = cause
        _log.debug("verdict: %s (node %s): %s", cause.kind.value, cause.node_index, cause.summary)
        if self.on_verdict is not None:
            self.on_verdict(cause)
        self._broadcast(msg.Abort(cause))

    def _restart(self, cause: Cause) -> bool:
        state = self.book.calls.get(cause.call) if cause.call is not None else None
        if not may_restart(state, cause, self.config.restarts):
            return False
        assert state is not None
        swapped = self.book.bench.swap(cause.node_index)  # a spare for the node the cause is pinned to
        bench, swapped_in = swapped if swapped is not None else (self.book.bench, None)
        if self.config.regrow and self.config.min_nodes:  # a restart anyway: the gang back to its size too
            bench = bench.regrow(self.config.num_nodes - self.config.spares, self.config.num_nodes)
        self._restart_with(state, cause, bench, swapped_in)
        return True

    def _restart_with(self, state: CallState, cause: Cause, bench: Bench, swapped_in: Optional[int]) -> None:
        """Every node told to start call ``state``'s ranks again, with ``bench`` (a swap, a loss or a regrowth)."""
        self.pending = None  # an echo held of the ranks being replaced
        index = begin_restart(state, find_free_port(self.host))
        old, self.book.bench = self.book.bench, bench
        changed = bench_changed(state.index, index, old, bench, cause.node_index, swapped_in, state.stores,
                                self.config.num_nodes)
        for told, peers in changed:
            self._send(told, peers)  # before the restart: the spare starts on it
        _log.debug("restart %d of call %d (port %s, spare in: %s): %s (node %s): %s", index, state.index,
                   state.rdzv_port, swapped_in, cause.kind.value, cause.node_index, cause.summary)
        self.training.restarted(index)  # nothing the replaced ranks reported is said after this
        source = next((peers.source_node for told, peers in changed if told == swapped_in), None)
        state.last_restart = msg.Restart(state.index, index, state.rdzv_port or 0, cause, bench, swapped_in, source)
        self._broadcast(state.last_restart)

    def _go_on_without(self, node: int, cause: Cause) -> bool:
        """A lost node taken out where the step allows it (``spares``, ``min_nodes``): a spare in its place or
        the gang smaller, in a restart of the call it was in; a spare lost is only taken off the bench."""
        config, bench = self.config, self.book.bench
        if not (config.spares or config.min_nodes) or not config.survives_loss or node in self.members.left:
            return False
        if node in bench.benched:
            lost = bench.lose(node, config.num_nodes, config.min_nodes)
            if lost is None:
                return False
            self.book.bench = lost[0]
            self._gone(node, "spare node %d (%s) lost: it is off the bench" % (node, self.members.hosts.get(node, "?")))
            return True
        state = self.book.calls.get(self.book.node_calls.get(node, 0) - 1)
        lost = bench.lose(node, config.num_nodes, config.min_nodes)
        if lost is None or state is None or not in_progress(state, bench.active_count(config.num_nodes)) \
                or state.restart >= config.restarts:
            return False
        self._gone(node, None)
        nodes = lost[0].active_count(config.num_nodes)
        summary = cause.summary if lost[1] is not None else "%s; the gang trains on without it, on %d node%s" % (
            cause.summary, nodes, "" if nodes == 1 else "s")
        self._restart_with(state, dataclasses.replace(cause, call=state.index, summary=summary), lost[0], lost[1])
        return True

    def _gone(self, node: int, line: Optional[str]) -> None:
        self.members.gone[node] = time.monotonic()
        self.book.gone.add(node)
        if line:
            self.say(line)

    def _came_back(self, node: int, host: str) -> None:
        """A lost node's task started again (a pod re-created): a spare now, authenticated like any node."""
        self.book.gone.discard(node)
        self.book.node_calls[node] = 0  # its new task makes the step's calls again, from the first
        self.book.bench = self.book.bench.readmit(node)
        self.say("node %d (%s) is back after it was lost: a spare now" % (node, host))

    def _back_unfit(self, node: int, cause: Optional[Cause]) -> None:
        """A node back whose preflight differs from the gang's stays out of it (it never trains)."""
        if cause is None:
            return
        benched = self.book.bench.lose(node, self.config.num_nodes, None)  # a spare now: off the bench, out
        if benched is not None:
            self.book.bench = benched[0]
        self.say("node %d is back but stays out: %s" % (node, cause.summary))

    def _rejoin_call(self, node: int, state: CallState) -> None:
        """A node back in a call it was in before it was lost: it sits out (the call's latest start told it
        where it stands); where the gang lost size, it grows back at the next restart point."""
        bench = self.book.bench
        self._send(node, msg.Go(state.index, state.rdzv_port or 0, bench))
        if state.last_restart is not None:
            self._send(node, dataclasses.replace(state.last_restart, bench=bench))
        active = bench.active_count(self.config.num_nodes)
        if not in_progress(state, active):
            self._send(node, msg.CallAllDone(state.index))
            return
        self._regrow_if_due()

    def _regrow_if_due(self) -> None:
        """The gang back to its size at a restart point: once every active node says the current start's
        ranks committed a snapshot (the restart then loses at most the step in flight). With no snapshots,
        at the next restart of another cause (``_restart``)."""
        config, bench = self.config, self.book.bench
        target = config.num_nodes - config.spares
        if not config.regrow or self.cause is not None or not bench.spares \
                or bench.active_count(config.num_nodes) >= target:
            return
        state = self.book.calls.get(max(self.book.calls)) if self.book.calls else None
        if state is None or not in_progress(state, bench.active_count(config.num_nodes)) \
                or state.restart >= config.restarts:
            return
        for node in range(config.num_nodes):  # O(nodes), only while a node waits to come back in
            if node in bench.benched:
                continue
            peer = self.members.by_node.get(node)
            if peer is None or peer.saved != state.restart:
                return
        grown = bench.regrow(target, config.num_nodes)
        came = [n for n in bench.spares if n not in grown.spares]
        cause = Cause(CauseKind.REGROWN, "%s back: the gang grows to %d nodes again"
                      % (", ".join("node %d (%s)" % (n, self.members.hosts.get(n, "?")) for n in came),
                         grown.active_count(config.num_nodes)), node_index=came[0], call=state.index)
        self._restart_with(state, cause, grown, None)

    def _broadcast(self, message: msg.GangMessage) -> None:
        data = encode(message.to_wire())
        for peer in list(self.members.by_node.values()):
            self.transport.send(peer, data)

    def _send(self, node: int, message: msg.GangMessage) -> None:
        peer = self.members.by_node.get(node)
        if peer is not None:
            self.transport.send(peer, encode(message.to_wire()))
