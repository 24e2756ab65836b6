"""The rank that holds up a collective: the suspected culprit of a hang.

In a hung gang every rank but one usually waits in the same collective; the one
that does not is named, from torch's Flight Recorder where the ranks answered,
else from the Python stacks. Pure (docs/seeing-the-gang.md).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Annotated, Any, Dict, List, Mapping, Optional, Tuple

from ..base.codec import SKIP, Written
from .flight import NO_GROUP, NOTE_CHARS, OK, UNSUPPORTED, FlightGroup, FlightSummary
from .ranges import numbers
from .stacks import main_thread, parse, where

_C10D = os.path.join("torch", "distributed", "distributed_c10d.py")
NAMED = 4  # suspects named one by one; more are counted
RECORDED_WAITING = 64  # waiting ranks the record lists; it counts them all
NO_STACK = "left no stack (it had ended, or did not answer)"
STACKS = "stacks"
FLIGHT_RECORDER = "flight_recorder"
_SAID = {STACKS: "from the stacks", FLIGHT_RECORDER: "from torch's Flight Recorder"}
_DEFAULT_GROUP = ("0", "default_pg")


def collective(text: str) -> Optional[str]:
    """The outermost frame in torch's c10d module: the call the rank's code made."""
    thread = main_thread(parse(text))
    if thread is None:
        return None
    inside = [f.function for f in thread.frames if f.file.endswith(_C10D)]
    return inside[-1] if inside else None


@dataclass(frozen=True)
class Suspect(Written):
    rank: int
    node: Optional[int]
    host: str
    where: str  # its place (stacks.py), NO_STACK, or "" when its recorder says enough
    flight: Annotated[str, SKIP] = ""  # what its Flight Recorder said, when that named it

    def line(self) -> str:
        node = "node %d" % self.node if self.node is not None else "node ?"
        said = "%s; at %s" % (self.flight, self.where) if self.flight and self.where else self.flight or self.where
        return "  rank %d (%s, %s): %s" % (self.rank, node, self.host or "?", said)


@dataclass(frozen=True)
class Culprits:
    """``suspects`` are the ranks not in ``collective`` (from the Flight
    Recorder: the ``seq``-th of process group ``group``)."""

    collective: str
    waiting: Tuple[int, ...]
    suspects: Tuple[Suspect, ...]
    more: int = 0  # suspects past NAMED, counted only
    signal: str = STACKS
    group: str = ""
    seq: int = 0
    unread: str = ""  # why torch's Flight Recorder could not say, where the stacks named them instead

    def lines(self) -> List[str]:
        count = len(self.suspects) + self.more
        which = self.collective
        if self.signal == FLIGHT_RECORDER:
            which = "%s #%d of process group %s" % (self.collective, self.seq, self.group)
        head = "Suspected cause: %s not in the %s that %s wait%s in (%s):" % (
            "rank %d is" % self.suspects[0].rank if count == 1 else "%d ranks are" % count, which,
            _ranks(self.waiting), "s" if len(self.waiting) == 1 else "", _SAID[self.signal])
        out = [head] + [s.line() for s in self.suspects]
        if self.more:
            out.append("  ... and %d more ranks" % self.more)
        if self.unread and self.signal == STACKS:
            out.append("  (not from torch's Flight Recorder: %s)" % self.unread)
        return out

    def to_wire(self) -> Dict[str, Any]:
        """Hand-written: the waiting ranks bounded, the recorder's fields only where it named them."""
        out = {"signal": self.signal, "collective": self.collective,
               "waiting": list(self.waiting[:RECORDED_WAITING]), "waiting_count": len(self.waiting),
               "suspects": [s.to_wire() for s in self.suspects], "more": self.more}
        if self.signal == FLIGHT_RECORDER:
            out.update(group=self.group, seq=self.seq)
        if self.unread:
            out["unread"] = self.unread
        return out


def unread_reason(flights: Mapping[int, FlightSummary]) -> str:
    """Why the recorders could not name anyone, where some could not be read (bounded)."""
    ranks = tuple(sorted(r for r, s in flights.items() if s.state == UNSUPPORTED))
    if not ranks:
        return ""
    return ("%s on %s" % (flights[ranks[0]].note or "unsupported", _ranks(ranks)))[:NOTE_CHARS * 2]


def _ranks(ranks: Tuple[int, ...]) -> str:
    return "rank %d" % ranks[0] if len(ranks) == 1 else "ranks %s" % numbers(ranks)


def find_culprits(stacks: Mapping[int, str], nodes: Mapping[int, int], hosts: Mapping[int, str],
                  ranks: Optional[Tuple[int, ...]] = None, base: Optional[str] = None,
                  flights: Optional[Mapping[int, FlightSummary]] = None) -> Optional[Culprits]:
    """``nodes``: rank -> node index; ``hosts``: node index -> host; ``ranks``:
    every rank of the call (one that left nothing is a suspect too)."""
    every = sorted(set(ranks or ()) | set(stacks) | set(flights or ()))
    found = _from_flights(flights or {}, every)
    if found is not None:
        name, waiting, outside, said, (group, seq) = found
        signal = FLIGHT_RECORDER
    else:
        inside = {rank: collective(text) for rank, text in stacks.items()}
        counts = Counter(name for name in inside.values() if name is not None)
        if not counts:
            return None
        name = max(sorted(counts), key=lambda n: counts[n])
        waiting = tuple(sorted(r for r, n in inside.items() if n == name))
        outside = [r for r in every if inside.get(r) != name]
        said, signal, group, seq = {}, STACKS, "", 0
    if not outside:
        return None
    suspects = []
    for rank in outside[:NAMED]:
        place = where(rank, stacks[rank]).place(base)[0] if rank in stacks else ("" if said else NO_STACK)
        node = nodes.get(rank)
        suspects.append(Suspect(rank, node, hosts.get(node, "") if node is not None else "", place,
                                said.get(rank, "")))
    return Culprits(name, waiting, tuple(suspects), max(0, len(outside) - NAMED), signal, group, seq,
                    unread_reason(flights or {}))


def _from_flights(flights: Mapping[int, FlightSummary], every: List[int]) -> Optional[Tuple[
        str, Tuple[int, ...], List[int], Dict[int, str], Tuple[str, int]]]:
    """The collective most ranks entered and wait in, the ranks behind it
    (furthest first) and what each recorder said. A rank with no summary is a
    suspect only for the default group, the one every rank is in."""
    usable = {r: s for r, s in flights.items() if s.state == OK}
    open_at = Counter((g.name, g.entered) for s in usable.values() for g in s.groups if g.waiting)
    if not open_at:
        return None
    group, seq = max(sorted(open_at), key=lambda k: open_at[k])
    at = {r: s.group(group) for r, s in usable.items()}
    ops = Counter(g.op for g in at.values() if g is not None and g.waiting and g.entered == seq)
    op = max(sorted(ops), key=lambda o: ops[o])
    waiting = tuple(sorted(r for r, g in at.items() if g is not None and g.waiting and g.entered == seq and g.op == op))
    default = any(g is not None and (g.name, g.desc) == _DEFAULT_GROUP for g in at.values())
    said: Dict[int, str] = {}
    for rank in every:
        g = at.get(rank)
        if g is not None and (g.entered > seq or (g.entered == seq and g.op == op)):
            continue  # in it, or past it
        if g is None and not default:
            continue  # not in that group, as far as can be told
        said[rank] = _behind(g, seq, group, flights.get(rank))
    order = sorted(said, key=lambda r: (at.get(r) is None, getattr(at.get(r), "entered", 0), r))
    return op, waiting, order, said, (group, seq)


def _behind(g: Optional[FlightGroup], seq: int, group: str, summary: Optional[FlightSummary]) -> str:
    if g is not None and g.entered == seq:
        return "entered %s #%d instead" % (g.op, g.entered)
    if g is not None:
        return "its last was %s #%d (%s)" % (g.op, g.entered, "completed" if g.done else "still waiting")
    if summary is None:
        return "its Flight Recorder did not answer"
    if summary.state == OK:
        return "no collective of process group %s recorded" % group
    if summary.state == NO_GROUP:
        return "no process group of torch.distributed"
    return "its Flight Recorder: %s" % (summary.note or summary.state)
