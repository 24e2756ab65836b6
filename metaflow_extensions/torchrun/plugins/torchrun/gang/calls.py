"""Matching ``current.torch.run`` calls across the gang's nodes: the
bookkeeping only (docs/design.md, "Calls are matched across nodes")."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Set, Tuple

from ..cause import Cause, CauseKind, plural
from ..procs.flight import FlightSummary
from ..procs.status import RankStatus
from . import messages as msg
from .bench import Bench
from .config import RDZV_STORE_NODE
from .wire import RANK0_MAX, ProtocolError

Left = Mapping[int, Tuple[int, bool]]  # node -> (calls made, ended fine)
# A replaced start's ranks kept for the control's card, from the nodes that reported its failure: the
# latest starts, a few nodes each (the failed ranks' first), a node's ranks bounded.
REPLACED_STARTS = 8
REPLACED_NODES = 4
REPLACED_RANKS = 16
Replaced = Dict[int, Dict[int, Tuple[RankStatus, ...]]]  # start (0: the first) -> node -> its ranks


@dataclass
class CallState:
    index: int
    entries: Dict[int, str] = field(default_factory=dict)  # node -> entrypoint name
    rdzv_port: Optional[int] = None
    first_entered: float = field(default_factory=time.monotonic)
    done: Set[int] = field(default_factory=set)
    reports: Dict[int, msg.NodeReport] = field(default_factory=dict)
    # The nodes whose report of the current start is in: a report a node made of a start a restart
    # replaced stays in ``reports`` (a node swapped out leaves none newer) but is not this start's.
    reported: Set[int] = field(default_factory=set)
    finished_at: Dict[int, float] = field(default_factory=dict)
    # Rank 0's pickled return value, kept only once its MAC checked out.
    rank0: Optional[bytes] = None
    rank0_node: Optional[int] = None
    rank0_error: Optional[str] = None
    # When the last node entered: hang detection counts from here.
    all_entered_at: Optional[float] = None
    went: Set[int] = field(default_factory=set)  # the nodes told to launch
    # After a failure, once per node: node -> rank -> stack, and -> Flight Recorder summary.
    stacks: Dict[int, Dict[int, str]] = field(default_factory=dict)
    flights: Dict[int, Dict[int, FlightSummary]] = field(default_factory=dict)
    stacks_in_said: bool = False
    # In-step restarts: how many so far, and the latest's start (hang detection counts from it).
    restart: int = 0
    restarted_at: Optional[float] = None
    replaced: Replaced = field(default_factory=dict)
    # Each node's snapshot store (its address for peers), as its ``call`` announced it.
    stores: Dict[int, Tuple[str, int]] = field(default_factory=dict)
    last_restart: Optional[msg.Restart] = None  # told again to a lost node that comes back

    def keep_store(self, node: int, address: Tuple[str, int]) -> None:
        """Where ``node``'s snapshot store takes its peers in this call."""
        self.stores[node] = address

    def say_stacks_in(self) -> bool:
        """True the first time: every node's stacks are in (said once per call)."""
        said, self.stacks_in_said = self.stacks_in_said, True
        return not said

    def told(self, restart: msg.Restart) -> None:
        """The latest restart every node was told: told again to a lost node that comes back."""
        self.last_restart = restart


@dataclass(frozen=True)
class CallView:
    index: int
    joined_at: Mapping[int, float]
    finished_at: Mapping[int, float]
    reports: Mapping[int, msg.NodeReport]
    stacks: Mapping[int, Mapping[int, str]]
    done: frozenset
    rank0: Optional[bytes] = None
    rank0_node: Optional[int] = None
    rank0_error: Optional[str] = None
    flights: Mapping[int, Mapping[int, FlightSummary]] = field(default_factory=dict)
    replaced: Replaced = field(default_factory=dict)

    @classmethod
    def of(cls, state: Optional[CallState], index: int, joined_at: Mapping[int, float]) -> "CallView":
        if state is None:
            return cls(index, dict(joined_at), {}, {}, {}, frozenset())
        return cls(index, dict(joined_at), dict(state.finished_at), dict(state.reports),
                   {n: dict(s) for n, s in state.stacks.items()}, frozenset(state.done),
                   state.rank0, state.rank0_node, state.rank0_error,
                   {n: dict(f) for n, f in state.flights.items()},
                   {k: dict(nodes) for k, nodes in state.replaced.items()})


class CallBook:
    def __init__(self, num_nodes: int, bench: Optional[Bench] = None) -> None:
        self.num_nodes = num_nodes
        self.bench = bench or Bench()
        self.calls: Dict[int, CallState] = {}
        self.node_calls: Dict[int, int] = {}  # node -> calls entered so far
        self.gone: Set[int] = set()  # nodes lost and taken out, not back: no call waits for them
        self.departed: Set[int] = set()  # of them, nodes told to go that ended their call: each later one at once

    def rebench(self, bench: Bench) -> None:
        """Who trains from now (the service's recovery decided it)."""
        self.bench = bench

    def went_on_without(self, node: int) -> None:
        """``node`` lost or cut off: no call waits for it."""
        self.gone.add(node)

    def depart(self, node: int) -> None:
        """``node`` told to go, its ranks stopped: no call waits for it, nor asks its calls to match."""
        self.gone.add(node)
        self.departed.add(node)

    def came_back(self, node: int) -> None:
        """A new task of a node the gang went on without: it makes the step's calls again, from the first."""
        self.gone.discard(node)
        self.departed.discard(node)
        self.node_calls[node] = 0

    def restart(self, state: CallState, rdzv_port: int, bench: Bench) -> int:
        """Call ``state``'s next start, on ``rdzv_port``, with ``bench``; its index."""
        index = begin_restart(state, rdzv_port)
        self.bench = bench
        return index

    def enter(self, node: int, call: msg.Call, left: Left) -> Tuple[CallState, Optional[Cause]]:
        """The cause that stops the gang, if this proves the nodes' calls differ."""
        if call.index != self.node_calls.get(node, 0):
            raise ProtocolError("call %d out of turn" % call.index)
        self.node_calls[node] = call.index + 1
        state = self.calls.setdefault(call.index, CallState(call.index))
        state.entries[node] = call.entry
        others = {e for n, e in state.entries.items() if n != node}
        if others and call.entry not in others:
            first = min(n for n in state.entries if n != node)
            return state, Cause(CauseKind.CALL_MISMATCH, "call %d of current.torch.run differs between nodes: node %d "
                                "runs %r, node %d runs %r; every node must make the same calls in the same order"
                                % (call.index + 1, node, call.entry, first, state.entries[first]),
                                node_index=node, call=call.index)
        for other, (made, ok) in sorted(left.items()):
            if ok and made <= call.index and other not in self.gone:
                return state, _left_early(other, made, node, call.index)
        if len(state.entries.keys() | self.gone) == self.num_nodes and state.all_entered_at is None:
            state.all_entered_at = time.monotonic()
        return state, None

    @staticmethod
    def to_launch(state: CallState, port: Callable[[], int]) -> List[int]:
        """Each node once it and node 0 are there: node 0's store is looked for only 60 s (``read_timeout``)."""
        if RDZV_STORE_NODE not in state.entries:
            return []
        if state.rdzv_port is None:
            state.rdzv_port = port()
        nodes = sorted(n for n in state.entries if n not in state.went)
        state.went.update(nodes)
        return nodes

    def finish(self, node: int, done: msg.CallDone, payload_ok: Callable[[msg.CallDone], bool]) -> CallState:
        """Raises for a done out of turn or a return value whose MAC does not check out."""
        state = self.calls.get(done.index)
        if state is None or node not in state.entries or node in state.done or state.all_entered_at is None:
            raise ProtocolError("done with a call it never started, or twice")
        if done.rank0 is not None:
            if not payload_ok(done):
                raise ProtocolError("rank 0's return value does not carry a valid proof")
            if state.rank0 is None:
                state.rank0, state.rank0_node = done.rank0, node
        if done.rank0_size is not None and state.rank0 is None:
            state.rank0_error = (
                "the return value of rank 0 (on node %d) is %d bytes pickled, over the %d bytes the gang "
                "carries: return something smaller, or save it (an artifact, S3) and return where it is"
                % (node, done.rank0_size, RANK0_MAX))
        self.keep_report(state, node, done.report)
        state.done.add(node)
        return state

    @staticmethod
    def keep_report(state: CallState, node: int, report: Optional[msg.NodeReport]) -> None:
        state.finished_at[node] = time.time()
        if report is not None:
            state.reports[node] = report
            state.reported.add(node)

    def keep_stacks(self, node: int, stacks: msg.Stacks) -> CallState:
        """Once per node and call, for the control's report; never acted on."""
        state = self.calls.get(stacks.call)
        if state is None or node not in state.entries or node in state.stacks:
            raise ProtocolError("stacks out of turn")
        state.stacks[node] = stacks.stacks
        state.flights[node] = stacks.flights
        return state

    def stacks_pending(self, index: int, connected: Callable[[int], bool], left: Left) -> List[int]:
        """In the call, not done, connected, not gone (stacks come before a leave), silent so far."""
        state = self.calls.get(index)
        if state is None:
            return []
        benched = self.bench.benched
        return sorted(n for n in state.entries if n not in state.stacks and n not in state.done
                      and n not in left and n not in benched and connected(n))

    def reports_pending(self, index: int, connected: Callable[[int], bool], left: Left) -> List[int]:
        """In the call, connected, not gone (a report comes before a leave), silent so far in the current
        start (a node that reported a replaced start's failure, node 0 included, reports again)."""
        state = self.calls.get(index)
        if state is None:
            return []
        benched = set(self.bench.spares)  # a node taken out reported the failure it was taken out for
        return sorted(n for n in state.entries if n not in state.reported and n not in left and n not in benched
                      and connected(n))

    def check_left(self, node: int, made: int, left: Left) -> Optional[Cause]:
        """A node that ended its step fine must have made the calls the others made (a node the gang went on
        without, told to go, need not)."""
        if node in self.gone:
            return None
        for other in sorted(self.node_calls):
            if other != node and self.node_calls[other] > made and other not in self.gone:
                return _left_early(node, made, other, made)
        for other, (their, ok) in sorted(left.items()):
            if other != node and ok and their != made and other not in self.gone:
                return Cause(CauseKind.CALL_MISMATCH, "node %d made %d call%s of current.torch.run in its step and "
                             "node %d made %d: every node must make the same calls"
                             % (node, made, "" if made == 1 else "s", other, their), node_index=node)
        return None

    def timed_out(self, now: float, start_timeout: float) -> Optional[Cause]:
        for state in self.calls.values():
            if state.all_entered_at is None and now - state.first_entered > start_timeout:
                absent = [n for n in range(self.num_nodes) if n not in state.entries and n not in self.gone]
                return Cause(CauseKind.CALL_TIMEOUT, "%s did not reach call %d of current.torch.run within %gs of node "
                             "%d (start_timeout): every node must make the same calls"
                             % (plural(absent), state.index + 1, start_timeout, min(state.entries)),
                             node_index=absent[0] if absent else None, missing=tuple(absent), call=state.index)
        return None

    def hung(self, now: float, limit: Optional[float], last_output: Callable[[int], Optional[float]],
             left: Left, advanced: bool = False) -> Optional[Cause]:
        """No rank wrote (or ``advanced`` a step) for ``limit``, measured on its node: clocks need not agree."""
        if not limit:
            return None
        for state in self.calls.values():
            if state.all_entered_at is None:
                continue
            benched = self.bench.benched
            running = [n for n in state.entries if n not in state.done and n not in left and n not in benched]
            if not running:
                continue
            begun = max(state.all_entered_at, state.restarted_at or 0.0)
            latest = max([begun] + [t for t in map(last_output, running) if t is not None])
            if now - latest >= limit:
                return Cause(CauseKind.HANG, "%s for %.0f s (hang_timeout=%gs), in call %d of current.torch.run"
                             % ("no rank advanced a step" if advanced else "no output from any rank", now - latest,
                                limit, state.index + 1), call=state.index)
        return None

    def waiting(self, now: float) -> Optional[str]:
        for index in sorted(self.calls):
            state = self.calls[index]
            if state.all_entered_at is None:
                absent = [m for m in range(self.num_nodes) if m not in state.entries]
                return "call %d of current.torch.run (%s): waiting for %s to reach it for %.0f s" % (
                    index + 1, next(iter(state.entries.values())), plural(absent), now - state.first_entered)
        return None


def _left_early(node: int, made: int, waiting: int, index: int) -> Cause:
    return Cause(CauseKind.LEFT_EARLY, "node %d ended its step after %d call%s of current.torch.run while node %d "
                 "waits in call %d: every node must make the same calls"
                 % (node, made, "" if made == 1 else "s", waiting, index + 1), node_index=node, call=index)


def begin_restart(state: CallState, rdzv_port: int) -> int:
    """The next restart's index, sent to every node as one ``Restart``; hang detection counts from now.
    The replaced start's ranks, as the nodes that reported its failure saw them, are kept for the card."""
    keep_replaced(state)
    state.reported.clear()
    state.restart += 1
    state.rdzv_port = rdzv_port
    state.restarted_at = time.monotonic()
    return state.restart


def keep_replaced(state: CallState) -> None:
    """The ranks of the start a restart replaces, from the reports of it (a report of an earlier start,
    left by a node that did not fail this time, is not this start's)."""
    nodes: Dict[int, Tuple[RankStatus, ...]] = {}
    for node, report in state.reports.items():
        ranks = tuple(r for r in report.ranks if r.restart == state.restart)
        if ranks:
            kept = [r for r in ranks if r.exit_code not in (0, None)] + [r for r in ranks if r.exit_code in (0, None)]
            nodes[node] = tuple(sorted(kept[:REPLACED_RANKS], key=lambda r: r.rank))
    chosen = sorted(nodes, key=lambda n: (not any(r.exit_code not in (0, None) for r in nodes[n]), n))
    if chosen:
        state.replaced[state.restart] = {n: nodes[n] for n in sorted(chosen[:REPLACED_NODES])}
    for old in sorted(state.replaced)[:-REPLACED_STARTS]:
        del state.replaced[old]
