"""The rank that holds up a collective: the suspected culprit of a hang.

Why: in a hung gang every rank but one is usually waiting in the same
collective, and the one to look at is the rank that is not: it is somewhere
else in its code (a desync: a skipped or extra collective, a branch taken on one
rank only), or it has ended. A longer NCCL timeout does not find it; the grouped
stacks show it only to a reader who compares them. This names it, by rank,
node and host, from the stacks the gang already collects at a stop
(stacks.py): the collective of ``torch.distributed`` each rank's main thread is
in, the one most of them wait in, and the ranks outside it.

Only what the Python stacks show: a collective issued without a Python frame
that waits (NCCL's asynchronous work, DDP's gradient hooks) is not seen. torch's
Flight Recorder (NCCL's trace buffer) would see those; it is not read here
(docs/seeing-the-gang.md). Pure: no I/O, no Metaflow.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .ranges import numbers
from .stacks import main_thread, parse, where

# The module of torch's collectives (all_reduce, barrier, broadcast, ...).
_C10D = os.path.join("torch", "distributed", "distributed_c10d.py")
# Suspects named one by one; more are counted (a gang of 8,192 ranks where one
# waits and the rest are elsewhere is not a hang of one rank).
NAMED = 4
NO_STACK = "left no stack (it had ended, or did not answer)"


def collective(text: str) -> Optional[str]:
    """The collective a rank's main thread waits in, from its dump: the
    outermost frame in torch's c10d module (the call the rank's code made)."""
    thread = main_thread(parse(text))
    if thread is None:
        return None
    inside = [f.function for f in thread.frames if f.file.endswith(_C10D)]
    return inside[-1] if inside else None


@dataclass(frozen=True)
class Suspect:
    rank: int
    node: Optional[int]
    host: str
    where: str  # its place (stacks.py), or NO_STACK

    def to_wire(self) -> Dict[str, Any]:
        return {"rank": self.rank, "node": self.node, "host": self.host, "where": self.where}


@dataclass(frozen=True)
class Culprits:
    """Ranks wait in ``collective``; ``suspects`` are the ranks not in it."""

    collective: str
    waiting: Tuple[int, ...]
    suspects: Tuple[Suspect, ...]
    more: int = 0  # suspects past NAMED, counted only

    def lines(self) -> List[str]:
        """What the failure message says, before where the ranks were."""
        count = len(self.suspects) + self.more
        head = "Suspected cause: %s not in the %s that %s wait%s in:" % (
            "rank %d is" % self.suspects[0].rank if count == 1 else "%d ranks are" % count, self.collective,
            _ranks(self.waiting), "s" if len(self.waiting) == 1 else "")
        out = [head]
        for s in self.suspects:
            node = "node %d" % s.node if s.node is not None else "node ?"
            out.append("  rank %d (%s, %s): %s" % (s.rank, node, s.host or "?", s.where))
        if self.more:
            out.append("  ... and %d more ranks" % self.more)
        return out

    def to_wire(self) -> Dict[str, Any]:
        return {"collective": self.collective, "waiting": list(self.waiting),
                "suspects": [s.to_wire() for s in self.suspects], "more": self.more}


def _ranks(ranks: Tuple[int, ...]) -> str:
    return "rank %d" % ranks[0] if len(ranks) == 1 else "ranks %s" % numbers(ranks)


def find_culprits(stacks: Mapping[int, str], nodes: Mapping[int, int], hosts: Mapping[int, str],
         ranks: Optional[Tuple[int, ...]] = None, base: Optional[str] = None) -> Optional[Culprits]:
    """The ranks outside the collective most waiting ranks are in. ``nodes``:
    rank -> node index; ``hosts``: node index -> host; ``ranks``: every rank of
    the call (those without a stack are suspects too). None when no rank waits
    in a collective, or none is outside it."""
    inside = {rank: collective(text) for rank, text in stacks.items()}
    counts = Counter(name for name in inside.values() if name is not None)
    if not counts:
        return None
    name = max(sorted(counts), key=lambda n: counts[n])
    waiting = tuple(sorted(r for r, n in inside.items() if n == name))
    every = sorted(set(ranks or ()) | set(stacks))
    outside = [r for r in every if inside.get(r) != name]
    if not outside:
        return None
    suspects = []
    for rank in outside[:NAMED]:
        place = where(rank, stacks[rank]).place(base)[0] if rank in stacks else NO_STACK
        node = nodes.get(rank)
        suspects.append(Suspect(rank, node, hosts.get(node, "") if node is not None else "", place))
    return Culprits(name, waiting, tuple(suspects), max(0, len(outside) - NAMED))
