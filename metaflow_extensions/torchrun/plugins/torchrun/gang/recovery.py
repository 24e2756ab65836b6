"""What the gang does next, after anything that can happen to it: one pure function, ``decide(event, state)``.

As torch's elastic agent says in one loop what follows any state (``SimpleElasticAgent._invoke_run``), every
rule of the gang's recovery is here, written once, and nothing else decides: the service (``handlers.py``)
builds a ``GangState`` from what it holds, asks, and applies the answer. The rules:

- a restart needs restarts left in the call (``restarts=N``), and a call every node reached and no active
  node finished (a restart of a rank's failure: no node at all);
- node 0 never leaves the gang: it hosts the service, the rendezvous store and rank 0;
- a node the gang goes on without: a spare takes its place first (``spares``), else the gang trains on
  smaller, never under ``min_nodes``; a node lost, silent past ``heartbeat_timeout`` or told to go (its
  SIGTERM, a spot notice) alike; the step's own stop (Ctrl-C, ``@timeout``) and the control's end it;
- the gang grows back (``regrow``) only at a restart point: once every training node saved a snapshot in
  the current start, or in a restart of another cause;
- a straggler never ends the gang: its node is swapped where it can be, else it trains on;
- a bug (a Python exception of the user's code) is never restarted: it would raise again.

Tested as a table, every event under every option, with no socket (tests/unit/test_recovery.py).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple, Union

from ..cause import Cause, CauseKind, restartable_in_step
from .bench import Bench
from .config import CONTROL_NODE, GangConfig

# What a node was told to go by, as runtime/stop.py names it, that the gang may go on without: the
# platform takes that node (a pod evicted, a node drained, a stopped job). A spot notice (a notice's time,
# no signal) is the other. Ctrl-C and @timeout stop the whole step: every node hears them.
DEPARTURES = frozenset(("SIGTERM",))


# -- what can happen -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Failed:
    """Any cause the gang stops for unless it restarts: a rank failed (its cause, from its node), a hang,
    a node that never joined or never reached a call, the step's own code raising, an echo past its grace."""

    cause: Cause


@dataclass(frozen=True)
class Dropped:
    """Node ``node``'s connection closed before its step ended: its task died (or its host went)."""

    node: int
    cause: Cause


@dataclass(frozen=True)
class Silent:
    """No heartbeat past ``heartbeat_timeout``: the silence's cause (``silence.py``) names one node
    (``node_index``), several at once (``missing``), or the control's lost contact with every node."""

    cause: Cause


@dataclass(frozen=True)
class ToldToGo:
    """A node was told to stop while its ranks ran: its ``PREEMPTED`` cause (runtime/stop.py) says by what."""

    cause: Cause


@dataclass(frozen=True)
class Back:
    """A new task of a node the gang went on without joined (a pod re-created)."""

    node: int


@dataclass(frozen=True)
class BackUnfit:
    """A node back whose preflight differs from the gang's."""

    node: int
    cause: Cause


@dataclass(frozen=True)
class Straggler:
    """The rank the others wait for at the collectives, on ``node``, for ``seconds`` (its cause said)."""

    node: int
    seconds: float
    cause: Cause


@dataclass(frozen=True)
class AllSaved:
    """Every training node's heartbeat says its ranks committed a snapshot in the current start."""


@dataclass(frozen=True)
class Preflight:
    """The preflight's verdict before any rank started: its ``cause`` (None: fit), the ``unfit`` nodes
    (the software check's), the ``blamed`` ones (their hosts' history)."""

    cause: Optional[Cause]
    unfit: Tuple[int, ...] = ()
    blamed: Tuple[int, ...] = ()


Event = Union[Failed, Dropped, Silent, ToldToGo, Back, BackUnfit, Straggler, AllSaved, Preflight]


# -- what the gang holds -------------------------------------------------------------------------------

@dataclass(frozen=True)
class CallNow:
    """The call an event concerns, as far as recovery cares: which, its restarts so far, whether every node
    reached it, and how many active nodes are done with it."""

    index: int
    restart: int = 0
    reached: bool = True
    done: int = 0


@dataclass(frozen=True)
class GangState:
    """What ``decide`` reads: the step's options, the bench, the call. O(spares) to build."""

    num_nodes: int
    restarts: int
    bench: Bench = Bench()
    call: Optional[CallNow] = None
    spares: int = 0
    min_nodes: Optional[int] = None
    regrow: bool = True
    survives_loss: bool = True
    swap_stragglers: Optional[float] = None
    hosts: Mapping[int, str] = field(default_factory=dict)  # read for the few nodes a line names

    @classmethod
    def of(cls, config: GangConfig, bench: Bench, call: Optional[CallNow],
           hosts: Mapping[int, str]) -> "GangState":
        return cls(config.num_nodes, config.restarts, bench, call, config.spares, config.min_nodes,
                   config.regrow, config.survives_loss, config.swap_stragglers, hosts)

    @property
    def active(self) -> int:
        return self.bench.active_count(self.num_nodes)


# -- what happens next ---------------------------------------------------------------------------------

class How(str, enum.Enum):
    IN_PLACE = "in place"  # every node's ranks again, the same nodes
    SWAP = "swap"  # a spare in the place of the node the cause is pinned to
    SHRINK = "shrink"  # the gang trains on one node smaller (min_nodes)
    REGROW = "regrow"  # spares back in until the gang has its size again


class Out(str, enum.Enum):
    """What becomes of the node an event took out of the gang."""

    LOST = "lost"  # its task died: no call waits for it; a new task of it may come back, as a spare
    CUT_OFF = "cut off"  # silent: as lost, and its connection closed and its processes killed where reachable
    DEPARTS = "departs"  # told to go: its ranks stopped with the grace, it ends its call as out, and its step


class Why(str, enum.Enum):
    """Why the bench changed without a restart."""

    SPARE_LOST = "spare lost"  # a benched node lost or silent: off the bench
    BACK = "back"  # a node back: a spare now
    BACK_UNFIT = "back unfit"  # a node back that stays out
    UNFIT = "unfit"  # the preflight's unfit nodes out, spares in, before any rank started
    BLAMED = "blamed"  # nodes whose hosts' history blames them start as spares


@dataclass(frozen=True)
class Nothing:
    """The gang goes on as it is."""


@dataclass(frozen=True)
class End:
    """The gang stops, every node told ``cause``."""

    cause: Cause


@dataclass(frozen=True)
class Restart:
    """Call ``call``'s ranks start again on every node with ``bench``; ``out``: what becomes of the node
    the cause is pinned to, where the gang goes on without it."""

    how: How
    call: int
    cause: Cause
    bench: Bench
    swapped_in: Optional[int] = None
    out: Optional[Out] = None


@dataclass(frozen=True)
class Rebench:
    """The bench changes, no restart: ``nodes`` are the ones it is about."""

    why: Why
    bench: Bench
    nodes: Tuple[int, ...] = ()
    out: Optional[Out] = None
    cause: Optional[Cause] = None


Decision = Union[Nothing, End, Restart, Rebench]


def decide(event: Event, state: GangState) -> Decision:
    """What the gang does after ``event``, given ``state``."""
    if isinstance(event, Failed):
        return _failed(event.cause, state)
    if isinstance(event, Dropped):
        return _without(event.node, event.cause, state, Out.LOST)
    if isinstance(event, Silent):
        return _silent(event.cause, state)
    if isinstance(event, ToldToGo):
        return _told(event.cause, state)
    if isinstance(event, Back):
        return Rebench(Why.BACK, state.bench.readmit(event.node), (event.node,))
    if isinstance(event, BackUnfit):
        benched = state.bench.lose(event.node, state.num_nodes, None)  # a spare now: off the bench, out
        return Rebench(Why.BACK_UNFIT, benched[0] if benched is not None else state.bench, (event.node,),
                       cause=event.cause)
    if isinstance(event, Straggler):
        return _straggler(event, state)
    if isinstance(event, AllSaved):
        return _regrow(state)
    return _preflight(event, state)


# -- the rules, each once ------------------------------------------------------------------------------

def restarts_left(state: GangState) -> bool:
    return state.call is not None and state.call.restart < state.restarts


def in_progress(state: GangState) -> bool:
    """Every node reached the call and its active nodes are not all done with it."""
    return state.call is not None and state.call.reached and state.call.done < state.active


def departs(cause: Cause) -> bool:
    """A node told to go by its platform (``DEPARTURES``, a spot notice), not the step told to stop."""
    if cause.kind is not CauseKind.PREEMPTED:
        return False
    return cause.exc_type in DEPARTURES or (cause.exc_type is None and cause.message is not None)


def may_go_on_without(state: GangState) -> bool:
    """The step asked to go on without a node, and the platform lets a step succeed without its task."""
    return bool(state.spares or state.min_nodes) and state.survives_loss


def wants_regrowth(state: GangState) -> bool:
    """A regrowth would be due if every training node had saved: asked before the service looks (O(nodes))."""
    return (state.regrow and bool(state.bench.spares) and state.active < state.num_nodes - state.spares
            and in_progress(state) and restarts_left(state))


def _failed(cause: Cause, state: GangState) -> Decision:
    call = state.call
    if call is None or not restarts_left(state) or not call.reached or call.done or not restartable_in_step(cause):
        return End(cause)
    swapped = state.bench.swap(cause.node_index)  # a spare for the node the cause is pinned to; never node 0
    bench, spare = swapped if swapped is not None else (state.bench, None)
    if state.regrow and state.min_nodes:  # a restart anyway: the gang back to its size too
        bench = bench.regrow(state.num_nodes - state.spares, state.num_nodes)
    how = How.SWAP if spare is not None else How.REGROW if bench != state.bench else How.IN_PLACE
    return Restart(how, call.index, cause, bench, spare)


def _without(node: int, cause: Cause, state: GangState, out: Out) -> Decision:
    """A node the gang goes on without, where the step allows it: a spare in its place or the gang smaller,
    in a restart of the call it was in; a spare (or a node already out) only taken off the bench."""
    if not may_go_on_without(state) or node == CONTROL_NODE:
        return End(cause)
    bench = state.bench
    if node in bench.benched:
        lost = bench.lose(node, state.num_nodes, state.min_nodes)
        return End(cause) if lost is None else Rebench(Why.SPARE_LOST, lost[0], (node,), out, cause)
    lost = bench.lose(node, state.num_nodes, state.min_nodes)
    call = state.call
    if lost is None or call is None or not in_progress(state) or not restarts_left(state):
        return End(cause)
    smaller, spare = lost
    if spare is None:
        nodes = smaller.active_count(state.num_nodes)
        cause = dataclasses.replace(cause, summary="%s; the gang trains on without it, on %d node%s"
                                    % (cause.summary, nodes, "" if nodes == 1 else "s"))
    return Restart(How.SWAP if spare is not None else How.SHRINK, call.index,
                   dataclasses.replace(cause, call=call.index, node_index=node), smaller, spare, out)


def _silent(cause: Cause, state: GangState) -> Decision:
    """One worker silent is taken out as a lost one is; several at once, or every node (the control likely
    the one cut off), end the gang with the silence's cause as precise as it is."""
    node = cause.node_index
    if node is None or cause.missing not in ((), (node,)):
        return End(cause)
    return _without(node, cause, state, Out.CUT_OFF)


def _told(cause: Cause, state: GangState) -> Decision:
    """A worker its platform takes (SIGTERM, a spot notice) leaves where the gang can go on; the step told
    to stop (Ctrl-C, @timeout), or the control told anything, stops the gang with every node's grace."""
    node = cause.node_index
    if node is None or not departs(cause):
        return End(cause)
    return _without(node, cause, state, Out.DEPARTS)


def _straggler(event: Straggler, state: GangState) -> Decision:
    after, bench = state.swap_stragglers, state.bench
    if after is None or event.seconds < after or event.node == CONTROL_NODE or not bench.spares \
            or event.node in bench.benched:
        return Nothing()
    call = state.call
    if call is None or not in_progress(state) or not restarts_left(state) or call.done:
        return Nothing()  # a straggler never ends the gang: with no restart left, it trains on
    decision = _failed(dataclasses.replace(event.cause, call=call.index), state)  # a swap, as a rank's failure's
    return decision if isinstance(decision, Restart) else Nothing()


def _regrow(state: GangState) -> Decision:
    """The gang back to its size at a restart point: every active node's ranks committed a snapshot in the
    current start (the restart then loses at most the step in flight)."""
    if not wants_regrowth(state):
        return Nothing()
    assert state.call is not None
    grown = state.bench.regrow(state.num_nodes - state.spares, state.num_nodes)
    came = [n for n in state.bench.spares if n not in grown.spares]
    cause = Cause(CauseKind.REGROWN, "%s back: the gang grows to %d nodes again"
                  % (", ".join("node %d (%s)" % (n, state.hosts.get(n, "?")) for n in came),
                     grown.active_count(state.num_nodes)), node_index=came[0], call=state.call.index)
    return Restart(How.REGROW, state.call.index, cause, grown)


def _preflight(event: Preflight, state: GangState) -> Decision:
    """Unfit nodes out and spares in where spares cover them all (never node 0); a blamed host starts as a
    spare where a clean one exists, and where no blamed node trains the gang starts on clean ones."""
    bench, cause = state.bench, event.cause
    if event.unfit:
        taken = bench.take_out(event.unfit) if bench.spares else None
        if taken is None:
            return End(cause) if cause is not None else Nothing()
        return Rebench(Why.UNFIT, taken, tuple(event.unfit), cause=cause)
    if event.blamed:
        preferred = bench.prefer(event.blamed)
        if all(preferred.node_rank(n) is None for n in event.blamed):
            return Rebench(Why.BLAMED, preferred, tuple(event.blamed))
        if cause is not None:
            return End(cause)
        return Rebench(Why.BLAMED, preferred, tuple(event.blamed)) if preferred != bench else Nothing()
    return End(cause) if cause is not None else Nothing()
