"""Hot spares (``@torchrun(spares=K)``): the bench holds the K nodes that do not
train (the spares not used yet, in the order they come in, and the nodes taken
out), so the service sends K indices whatever the gang's size and every node
derives its torchrun node rank from it. Node 0 hosts the store: never benched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Iterable, Optional, Tuple

from ..base import defaults as DEFAULTS
from ..base.codec import Int, Items, Record
from .wire import ProtocolError

LIMIT = DEFAULTS.MAX_SPARES
Benched = Annotated[Tuple[Annotated[int, Int(1, (1 << 20) - 1)], ...], Items(LIMIT)]


@dataclass(frozen=True)
class Bench(Record):
    """At most ``LIMIT`` indices of nodes, none twice, never node 0."""

    ERROR = ProtocolError
    spares: Benched = ()
    out: Benched = ()

    @classmethod
    def initial(cls, num_nodes: int, spares: int) -> "Bench":
        return cls(tuple(range(num_nodes - spares, num_nodes)) if 0 < spares < num_nodes else ())

    @property
    def benched(self) -> Tuple[int, ...]:
        return self.spares + self.out

    def active_count(self, num_nodes: int) -> int:
        return num_nodes - len(self.benched)

    def node_rank(self, node: int) -> Optional[int]:
        """Its place among the active nodes (O(K), not O(N)); None where benched."""
        if node in self.benched:
            return None
        return node - sum(1 for b in self.benched if b < node)

    def role(self, node: int) -> str:
        return "out" if node in self.out else "spare" if node in self.spares else "active"

    def buddy(self, node: int, num_nodes: int) -> Optional[int]:
        """The next active node after ``node``, round the ring of active nodes (O(K)): where its snapshot
        shards are copied. None where ``node`` is the only one."""
        step = node
        for _ in range(len(self.benched) + 1):
            step = (step + 1) % num_nodes
            if step not in self.benched:
                return step if step != node else None
        return None

    def buddied_by(self, node: int, num_nodes: int) -> Optional[int]:
        """The active node whose buddy ``node`` is (the previous active one round the ring)."""
        step = node
        for _ in range(len(self.benched) + 1):
            step = (step - 1) % num_nodes
            if step not in self.benched:
                return step if step != node else None
        return None

    def swap(self, node: Optional[int]) -> Optional[Tuple["Bench", int]]:
        """``node`` out and the first spare in, where it can be; else None (restart in place)."""
        if node is None or node == 0 or node in self.benched or not self.spares:
            return None
        return Bench(self.spares[1:], self.out + (node,)), self.spares[0]

    def lose(self, node: int, num_nodes: int, min_nodes: Optional[int]) -> Optional[Tuple["Bench", Optional[int]]]:
        """A lost node out: a spare in where one is left, else the gang one node smaller where ``min_nodes``
        allows it (the spare brought in, or None); None where it cannot go on (node 0, or too few left).
        A lost spare or node already out is taken off the bench's spares and the gang goes on as it was."""
        if node == 0 or not 0 < node < num_nodes:
            return None
        if node in self.benched:
            return Bench(tuple(s for s in self.spares if s != node), self.out + ((node,) if node not in self.out
                                                                                 else ())), None
        swapped = self.swap(node)
        if swapped is not None:
            return swapped
        if min_nodes is not None and self.active_count(num_nodes) - 1 >= min_nodes:
            return Bench(self.spares, self.out + (node,)), None
        return None

    def readmit(self, node: int) -> "Bench":
        """A node taken out came back: a spare again (last in line)."""
        if node not in self.out:
            return self
        return Bench(self.spares + (node,), tuple(n for n in self.out if n != node))

    def regrow(self, active: int, num_nodes: int) -> "Bench":
        """Spares in until ``active`` nodes train (the gang's size before a loss shrank it)."""
        short = max(0, active - self.active_count(num_nodes))
        return Bench(self.spares[short:], self.out) if short else self

    def prefer(self, avoid: Iterable[int]) -> "Bench":
        """Each active node in ``avoid`` changes places with a clean spare, where one is left (a spare still)."""
        bench, blamed = self, set(avoid)
        clean = [s for s in self.spares if s not in blamed]
        for node in sorted(blamed):
            if not clean or node == 0 or node in bench.benched:
                continue
            spare = clean.pop(0)
            spares = tuple(node if s == spare else s for s in bench.spares)
            bench = Bench(spares, bench.out)
        return bench

    def take_out(self, unfit: Iterable[int]) -> Optional["Bench"]:
        """Every node in ``unfit`` out, a spare in for each; None where node 0 is unfit or spares are too few."""
        unfit = set(unfit)
        if 0 in unfit:
            return None
        fit = [s for s in self.spares if s not in unfit]
        going = sorted(n for n in unfit if n not in self.out)
        needed = [n for n in going if n not in self.spares]
        if len(needed) > len(fit):
            return None
        used = fit[:len(needed)]
        spares = tuple(s for s in self.spares if s not in used and s not in unfit)
        return Bench(spares, self.out + tuple(going))

    def seat(self, node: int, num_nodes: int) -> "Seat":
        return Seat(self, self.node_rank(node), self.active_count(num_nodes), self.role(node))

    def problem(self) -> Optional[str]:
        both = self.benched
        if len(both) > LIMIT or len(set(both)) != len(both):
            return "more than %d nodes, or a node twice" % LIMIT
        return None


@dataclass(frozen=True)
class Seat:
    """One node's place in a start of a call's ranks (``node_rank`` None: it sits it out)."""

    bench: Bench
    node_rank: Optional[int]
    nnodes: int
    role: str
