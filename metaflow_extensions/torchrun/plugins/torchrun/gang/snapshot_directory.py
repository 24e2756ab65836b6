"""Where each node's snapshot store is, told to the nodes that need it: its buddy's (the next active node
round the ring, which keeps a copy of its shards) and, for a spare brought in, the store that holds the
replaced node's state. Each message names one node's two addresses, never the gang's list; the service
learns a store's address from the node's own connection and the port its ``call`` announced."""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from . import messages as msg
from .bench import Bench

Address = Tuple[str, int]
Stores = Dict[int, Address]  # node -> its store, for one call


def on_entered(index: int, node: int, stores: Stores, bench: Bench, num_nodes: int
               ) -> List[Tuple[int, msg.SnapshotPeers]]:
    """``node`` entered call ``index`` with a store: itself told of its buddy where that one is known,
    and the node whose buddy it is told of it."""
    told = []
    buddy = bench.buddy(node, num_nodes)
    if buddy is not None and buddy in stores:
        told.append((node, msg.SnapshotPeers(index, 0, stores[buddy])))
    before = bench.buddied_by(node, num_nodes)
    if before is not None and before != node and before in stores:
        told.append((before, msg.SnapshotPeers(index, 0, stores[node])))
    return told


def bench_changed(index: int, restart: int, old: Bench, new: Bench, out: Optional[int], spare: Optional[int],
                  stores: Stores, num_nodes: int) -> List[Tuple[int, msg.SnapshotPeers]]:
    """A restart that changed who trains (a swap, a node lost, the gang grown back): each node brought in told
    where state it lacks is (for a spare in ``out``'s place, ``out``'s old buddy's store, which holds its
    shards; for a node added, its new buddy's: replicated state, any node's copy serves), and each node whose
    buddy changed told its new one. O(K) messages, K the nodes whose place changed."""
    came = [n for n in old.benched if n not in new.benched]
    went = [n for n in new.benched if n not in old.benched]
    told: Dict[int, msg.SnapshotPeers] = {}
    candidates: Set[Optional[int]] = set(came)
    candidates.update(new.buddied_by(n, num_nodes) for n in came)
    candidates.update(old.buddied_by(n, num_nodes) for n in went)
    for node in candidates:
        if node is None or node in new.benched or node not in stores:
            continue
        buddy = new.buddy(node, num_nodes)
        holder = None
        if node in came:
            holder = old.buddy(out, num_nodes) if node == spare and out is not None else buddy
        source = stores.get(holder) if holder is not None else None
        told[node] = msg.SnapshotPeers(index, restart, stores.get(buddy) if buddy is not None else None,
                                       source, holder if source is not None else None)
    return sorted(told.items())


def address_of(peer_name: Optional[Tuple[str, int]], port: Optional[int]) -> Optional[Address]:
    """The store's address: the IP the node's connection came from, and the port it announced."""
    if port is None or not peer_name:
        return None
    return peer_name[0], port
