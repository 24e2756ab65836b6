"""What the gang service hears and how it answers: each member's message (one handler per type), a
dropped connection, and the checks' timeouts.

``Handlers`` is the protocol's dispatcher. What the gang does after a failure, a loss, a silence, a node
told to go, a node back, a straggler, a snapshot everywhere or the preflight's verdict is decided by
``recovery.decide`` alone; here it is asked (``_decide``) and its answer applied (``_apply``): a restart,
a bench changed, the end. The state it changes belongs to ``Membership`` and ``CallBook``, each changed
through its own methods. The service (``server.py``) owns the thread, the lock and the timing."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from ..cause import Cause, CauseKind
from ..host import log
from . import messages as msg
from . import recovery
from .admission import Admission
from .bench import Bench
from .calls import CallBook, CallState
from .config import CONTROL_NODE, GangConfig
from .gang_progress import ProgressBook, duration
from .membership import Membership, NodeEnd
from .node_compare import HostCheck, PreflightBook
from .peer import Peer
from .ports import find_free_port
from .snapshot_directory import address_of, bench_changed, on_entered
from .transport import Transport
from .wire import ProtocolError, encode

_log = log.get("gang.server")


class Handlers:
    def __init__(self, config: GangConfig, host: str, admission: Admission, transport: Transport,
                 say: Callable[[str], None], host_check: Optional[HostCheck] = None,
                 on_verdict: Optional[Callable[[Cause], None]] = None,
                 on_cut_off: Optional[Callable[[int], None]] = None) -> None:
        """``host``: where the calls' rendezvous ports are found free; ``on_verdict``: told the verdict
        before any node (a local control's node tasks, whose echoes then wait for the root cause);
        ``on_cut_off``: told a silent node the gang went on without (a local control kills its task)."""
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
        self.on_cut_off = on_cut_off
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

    # -- who speaks ------------------------------------------------------------------------------------

    def _on_hello(self, peer: Peer, line: msg.WireDict) -> None:
        proved = self.admission.hello(peer, line)
        if proved is not None and self.members.taken(proved[0]):
            self.transport.send(peer, encode(msg.Reject("node %d is taken" % proved[0]).to_wire()))
            proved = None
        if proved is None:
            self.transport.flush(peer)
            self.transport.drop(peer)
            return
        node, client_nonce, host = proved
        self.admission.forget(peer)
        if self.members.join(node, peer, host):
            self._came_back(node, host)
        self.admission.welcome(peer, node, client_nonce, self.cause)
        _log.debug("node %d joined from %s (%d of %d)", node, host, len(self.members.by_node),
                   self.config.num_nodes)
        self.transport.flush(peer)
        self.transport.resume(time.monotonic())

    def _on_probe(self, peer: Peer, line: msg.WireDict) -> None:
        """As good as hearing the member on its own connection. A node the gang does not hold (never
        joined, or taken out after a silence: its late words are not its gang's) is refused, unless the
        gang is over: then it hears why."""
        proved = self.admission.probe(peer, line)
        if proved is not None:
            node, client_nonce = proved
            if self.members.probed(node) or self.cause is not None:
                self.admission.welcome(peer, node, client_nonce, self.cause)
            else:
                peer.queue(encode(msg.Reject("node %d is not in the gang" % node).to_wire()))
        self.transport.flush(peer)
        if not peer.outbox:  # else it closes once written, or HELLO_TIMEOUT drops it
            self.transport.drop(peer)

    # -- what members say ------------------------------------------------------------------------------

    def _on_heartbeat(self, peer: Peer, message: msg.GangMessage) -> None:
        assert isinstance(message, msg.Heartbeat) and peer.node is not None
        if self.members.heartbeat(peer, message, time.monotonic()):
            self._regrow_if_due()
        if message.progress is not None:
            self.training.update(peer.node, peer.host, message.progress)

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
        if state.say_stacks_in():
            self._broadcast(msg.StacksIn(state.index))

    def _on_call(self, peer: Peer, message: msg.GangMessage) -> None:
        assert isinstance(message, msg.Call) and peer.node is not None
        if peer.node in self.book.departed:
            self._sit_out(peer.node, message.index)
            return
        rejoined = peer.node in self.members.returned and message.index in self.book.calls and \
            peer.node in self.book.calls[message.index].went
        state, cause = self.book.enter(peer.node, message, self.members.left)
        self.members.new_call(peer)
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
            self._decide(recovery.Failed(cause))
            return
        if self.config.spares and self.preflight.fingerprints and not self.preflight.decided:
            return  # the go waits for the preflight's verdict, which may bench an unfit node
        self._launch(state)

    def _sit_out(self, node: int, index: int) -> None:
        """A node told to go, its ranks stopped, goes on with its step: each later call is over for it at once
        (it launches nothing: any port will do)."""
        state = self.book.calls.get(index)
        port = state.rdzv_port if state is not None and state.rdzv_port else find_free_port(self.host)
        self._send(node, msg.Go(index, port, self.book.bench))
        self._send(node, msg.CallAllDone(index))

    def _snapshot_store(self, peer: Peer, node: int, state: CallState, port: Optional[int]) -> None:
        try:
            address = address_of(peer.sock.getpeername(), port)
        except OSError:
            address = None
        if address is None:
            return
        state.keep_store(node, address)
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
        if cause.kind is CauseKind.PREEMPTED:
            self._decide(recovery.ToldToGo(cause))
        elif not cause.secondary:
            self._decide(recovery.Failed(cause))
        elif self.pending is None:
            self.pending = (cause, time.monotonic() + self.config.secondary_grace)

    def _on_preflight(self, peer: Peer, message: msg.GangMessage) -> None:
        """The last one decides, before its node can send the ``call`` that would launch it, so before any
        rank starts. With spares the other nodes' go waits for it too: the verdict may change the bench."""
        assert isinstance(message, msg.Preflight) and peer.node is not None
        node = peer.node
        if node in self.members.returned and node in self.preflight.fingerprints:
            cause = self.preflight.again(node, message)
            if cause is not None:
                self._decide(recovery.BackUnfit(node, cause))
            return
        if not self.preflight.keep(node, message) or self.cause is not None:
            return
        cause = self.preflight.verdict()
        unfit = tuple(self.preflight.unfit()) if cause is not None else ()
        if isinstance(self._decide(recovery.Preflight(cause, unfit)), recovery.End):
            return
        for line in self.preflight.warnings():
            self.say("preflight: " + line)
        if self.host_check is not None:
            lines, cause, blamed = self.host_check(dict(self.members.hosts))
            for line in lines:
                self.say("preflight: " + line)
            if isinstance(self._decide(recovery.Preflight(cause, blamed=tuple(blamed))), recovery.End):
                return
        for state in list(self.book.calls.values()):  # the calls whose go waited for this verdict (_on_call)
            self._launch(state)

    def _on_leave(self, peer: Peer, message: msg.GangMessage) -> None:
        assert isinstance(message, msg.Leave) and peer.node is not None
        node = peer.node
        made = self.book.node_calls.get(node, 0)  # the calls it entered, whatever its leave says
        self.members.leave(node, made, message.ok)
        _log.debug("node %d left after %d calls (%s)", node, made, "ok" if message.ok else "failed")
        if self.cause is None:
            if not message.ok:
                self._decide(recovery.Failed(Cause(CauseKind.STEP_FAILED, "node %d ended its step with an error"
                                                   % node, node_index=node)))
            else:
                cause = self.book.check_left(node, made, self.members.left)
                if cause is not None:
                    self._decide(recovery.Failed(cause))
        self._all_left(time.monotonic())

    def _all_left(self, now: float) -> None:
        if not self.all_left_said and self.members.all_left(now):
            self.all_left_said = True
            self._send(CONTROL_NODE, msg.AllLeft())

    # -- what the service finds itself -----------------------------------------------------------------

    def dropped(self, peer: Peer) -> None:
        node = peer.node
        if not self.members.lost(peer) or self.cause is not None or node is None:
            return
        if self.pending is not None and self.pending[0].node_index == node:
            return  # it reported an echo and exited: wait for the grace to decide
        self._decide(recovery.Dropped(node, Cause(
            CauseKind.NODE_LOST, "node %d (%s) disconnected before its step ended: its task died or was killed"
            % (node, peer.host), node_index=node)))

    def check(self, now: float, node_ends: Optional[Callable[[], Mapping[int, NodeEnd]]]) -> None:
        ended = self.members.saw_ends(node_ends)  # after an abort too, for everyone_heard
        for state in list(self.book.calls.values()):  # stacks in from every node that may still send them
            if state.stacks and not state.stacks_in_said and not self._owe_stacks(state.index):
                self._stacks_in(state)
        if self.cause is None:
            cause = self._overdue(now, ended)
            if cause is not None:
                self._decide(recovery.Failed(cause))
            else:
                silent = self.members.silent(now)
                if silent is not None:
                    self._decide(recovery.Silent(silent))
        if self.members.gone:
            self._all_left(now)
        if self.cause is None and self.config.swap_stragglers is not None:
            self._swap_straggler()

    def _swap_straggler(self) -> None:
        """The rank the others wait for at the collectives, named long enough: the policy may swap its node."""
        late, after = self.training.late, self.config.swap_stragglers
        if late is None or after is None or late.node_index in self.book.bench.benched:
            return
        cause = Cause(CauseKind.STRAGGLER, "node %d (%s, ranks %s) has been the one the others wait for at the "
                      "collectives for %s, %.0f ms of every second, each step %.2fx the time it would take "
                      "(swap_stragglers=%gs)" % (late.node_index, late.host, late.ranks, duration(late.seconds),
                                                 late.wait_ms or 0.0, late.ratio, after), node_index=late.node_index)
        self._decide(recovery.Straggler(late.node_index, late.seconds, cause))

    def _overdue(self, now: float, ended: Optional[Cause] = None) -> Optional[Cause]:
        if self.pending is not None and now >= self.pending[1]:
            return self.pending[0]  # no better cause came: the echo it is
        return (
            ended
            or self.members.never_joined(now)
            or self.book.timed_out(now, self.config.start_timeout)
            or self.book.hung(now, self.config.hang_timeout, self._last_output, self.members.left,
                              advanced=self.training.reporting)
        )

    def _last_output(self, node: int) -> Optional[float]:
        """hang_timeout's clock: when the ranks last advanced a step while they report progress, else wrote."""
        peer = self.members.by_node.get(node)
        if peer is None:
            return None
        return peer.last_advance if peer.last_advance is not None else peer.last_output

    def waiting(self, now: float) -> Optional[str]:
        return self.members.waiting(now) or self.book.waiting(now)

    # -- asking the policy, applying its answer --------------------------------------------------------

    def _decide(self, event: recovery.Event) -> recovery.Decision:
        decision = recovery.decide(event, self._state(event))
        self._apply(decision)
        return decision

    def _state(self, event: recovery.Event) -> recovery.GangState:
        """What the policy reads, O(spares): the call the event concerns (a node's own, a cause's, the latest)."""
        book = self.book
        if isinstance(event, (recovery.Dropped, recovery.Silent, recovery.ToldToGo)):
            node = event.node if isinstance(event, recovery.Dropped) else event.cause.node_index
            state = book.calls.get(book.node_calls.get(node, 0) - 1) if node is not None else None
        elif isinstance(event, recovery.Failed):
            state = book.calls.get(event.cause.call) if event.cause.call is not None else None
        else:
            state = book.calls[max(book.calls)] if book.calls else None
        return self._state_of(state)

    def _state_of(self, state: Optional[CallState]) -> recovery.GangState:
        call = None if state is None else recovery.CallNow(state.index, state.restart,
                                                            state.all_entered_at is not None, len(state.done))
        return recovery.GangState.of(self.config, self.book.bench, call, self.members.hosts)

    def _apply(self, decision: recovery.Decision) -> None:
        if isinstance(decision, recovery.End):
            self._end(decision.cause)
        elif isinstance(decision, recovery.Restart):
            node = decision.cause.node_index
            if decision.out is not None and node is not None:
                self._take_out(node, decision.out, decision.cause)
            self._restart_with(self.book.calls[decision.call], decision.cause, decision.bench, decision.swapped_in)
        elif isinstance(decision, recovery.Rebench):
            self._rebench(decision)

    def _end(self, cause: Cause) -> None:
        """The gang's verdict, to every node."""
        self.pending = None
        self.cause = cause
        _log.debug("verdict: %s (node %s): %s", cause.kind.value, cause.node_index, cause.summary)
        if self.on_verdict is not None:
            self.on_verdict(cause)
        self._broadcast(msg.Abort(cause))

    def _restart_with(self, state: CallState, cause: Cause, bench: Bench, swapped_in: Optional[int]) -> None:
        """Every node told to start call ``state``'s ranks again, with ``bench`` (a swap, a loss or a regrowth)."""
        self.pending = None  # an echo held of the ranks being replaced
        old = self.book.bench
        index = self.book.restart(state, find_free_port(self.host), bench)
        changed = bench_changed(state.index, index, old, bench, cause.node_index, swapped_in, state.stores,
                                self.config.num_nodes)
        for told, peers in changed:
            self._send(told, peers)  # before the restart: the spare starts on it
        _log.debug("restart %d of call %d (port %s, spare in: %s): %s (node %s): %s", index, state.index,
                   state.rdzv_port, swapped_in, cause.kind.value, cause.node_index, cause.summary)
        self.training.restarted(index)  # nothing the replaced ranks reported is said after this
        source = next((peers.source_node for told, peers in changed if told == swapped_in), None)
        state.told(msg.Restart(state.index, index, state.rdzv_port or 0, cause, bench, swapped_in, source))
        assert state.last_restart is not None
        self._broadcast(state.last_restart)

    def _take_out(self, node: int, out: recovery.Out, cause: Cause) -> None:
        """What becomes of a node the gang goes on without: no call waits for it; one cut off is told why on
        its old connection, which is then closed (what it may still send is never read), and its processes
        killed where this host can reach them; one told to go ends its call when it hears the restart."""
        if out is recovery.Out.DEPARTS:
            self.book.depart(node)
            return
        self.book.went_on_without(node)
        if out is recovery.Out.LOST:
            self.members.went_on_without(node)
            return
        peer = self.members.cut_off(node)
        if peer is not None:
            told = dataclasses.replace(cause, summary="node %d was taken out of the gang, which went on without it: %s"
                                       % (node, cause.summary))
            self.transport.send(peer, encode(msg.Abort(told).to_wire()))
            self.transport.drop(peer)
        if self.on_cut_off is not None:
            self.on_cut_off(node)

    def _rebench(self, decision: recovery.Rebench) -> None:
        old, bench, why = self.book.bench, decision.bench, decision.why
        self.book.rebench(bench)
        hosts = self.members.hosts
        for node in decision.nodes:
            host = hosts.get(node, "?")
            if why is recovery.Why.SPARE_LOST and node in old.spares:
                self.say("spare node %d (%s) lost: it is off the bench" % (node, host))
            elif why is recovery.Why.BACK:
                self.say("node %d (%s) is back after it was lost: a spare now" % (node, host))
            elif why is recovery.Why.BACK_UNFIT and decision.cause is not None:
                self.say("node %d is back but stays out: %s" % (node, decision.cause.summary))
            elif why is recovery.Why.UNFIT and decision.cause is not None:
                self.say("preflight: node %d (%s) taken out before any rank started: %s"
                         % (node, host, decision.cause.summary.split(": ", 1)[-1]))
            elif why is recovery.Why.BLAMED and bench.node_rank(node) is None and old.node_rank(node) is not None:
                self.say("preflight: node %d (%s) starts as a spare: its host's history (above)" % (node, host))
        if why is recovery.Why.UNFIT:
            came = [n for n in old.spares if n not in bench.spares and n not in bench.out]
            self.say("preflight: spare node%s %s brought in" % ("s" if len(came) > 1 else "",
                                                               ", ".join(map(str, came))))
        if decision.out is not None and decision.cause is not None:
            for node in decision.nodes:
                self._take_out(node, decision.out, decision.cause)

    def _came_back(self, node: int, host: str) -> None:
        """A lost node's task started again (a pod re-created): a spare now, authenticated like any node."""
        self.book.came_back(node)
        self._decide(recovery.Back(node))

    def _rejoin_call(self, node: int, state: CallState) -> None:
        """A node back in a call it was in before it was lost: it sits out (the call's latest start told it
        where it stands); where the gang lost size, it grows back at the next restart point."""
        bench = self.book.bench
        self._send(node, msg.Go(state.index, state.rdzv_port or 0, bench))
        if state.last_restart is not None:
            self._send(node, dataclasses.replace(state.last_restart, bench=bench))
        if not recovery.in_progress(self._state_of(state)):
            self._send(node, msg.CallAllDone(state.index))
            return
        self._regrow_if_due()

    def _regrow_if_due(self) -> None:
        """Asked when a node's ranks saved in a newer start, or a node is back in a running call: the policy
        says whether a regrowth could be due before the O(nodes) look at every node's snapshot."""
        if self.cause is not None or not self.book.calls:
            return
        state = self._state(recovery.AllSaved())
        if not recovery.wants_regrowth(state) or state.call is None:
            return
        if self.members.all_saved(self.book.bench, state.call.restart):
            self._apply(recovery.decide(recovery.AllSaved(), state))

    def _broadcast(self, message: msg.GangMessage) -> None:
        data = encode(message.to_wire())
        for peer in list(self.members.by_node.values()):
            self.transport.send(peer, data)

    def _send(self, node: int, message: msg.GangMessage) -> None:
        peer = self.members.by_node.get(node)
        if peer is not None:
            self.transport.send(peer, encode(message.to_wire()))
