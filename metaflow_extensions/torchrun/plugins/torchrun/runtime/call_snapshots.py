"""This node's snapshot store for one call (``CallSnapshots``): opened before the node enters the call (its
port goes with the ``call``), told where its peers are as the gang says it, its socket in every start's
environment, and closed with the call, every snapshot freed. A restart or a swap finds the store as the
replaced ranks left it: that is what lets the new ranks resume at the step they failed on.

The store's socket is in a work directory of its own under the task's private base, held "in use" while
the store runs (``host/workdirs.StepDir``): ``close`` removes it, and where a task ends without closing it
(SIGKILLed: a node lost, a pod deleted; the default action of a SIGTERM), the next call on the host sweeps
it with the other work directories no live process holds. (It was a ``mkdtemp`` in TMPDIR: each task
killed with a store left a ``mftr-snap-*`` there for good.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

from ..base import defaults as DEFAULTS
from ..gang import messages as msg
from ..gang.client import GangClient
from ..host.console import say
from ..host.workdirs import StepDir
from ..procs.names import OFF_BY_SETTING, OFF_NO_RESTARTS, OFF_ON_NODE, SNAPSHOT_EVERY_ENV, SNAPSHOTS_OFF_ENV

if TYPE_CHECKING:
    from ..snapshots.node import Budget, SnapshotStore

MB = 1 << 20


@dataclass(frozen=True)
class Resumed:
    """Where a restart's ranks resumed: the step, whose copy (None: this node's), the newest step saved,
    when the copy resumed from was saved on this node (wall clock)."""

    step: int
    source_node: Optional[int]
    newest: int
    saved_at: Optional[float] = None

    def steps_lost(self, reported: Optional[int] = None) -> int:
        """The steps after the one resumed: the newest saved, or the newest the replaced ranks reported
        (``progress.report`` or a trainer's), where that is later."""
        return max(0, max(self.newest, reported or 0) - self.step)


def budget_for(memory: Optional[float], share_of: Optional[Callable[[float], "Budget"]] = None) -> "Budget":
    """``@torchrun(snapshot_memory)``: MB (> 1), a share of the room the container has (<= 1), or the
    default share; the budget says where it came from (a refusal names it)."""
    from ..snapshots import node

    reader = share_of or node.share_of
    if memory is None:
        return reader(DEFAULTS.SNAPSHOT_MEMORY_SHARE)
    if memory > 1:
        return node.Budget(int(memory * MB), "@torchrun(snapshot_memory=%d)" % memory)
    found = reader(memory)
    return node.Budget(found.bytes, "%s, as @torchrun(snapshot_memory) sets" % found.source)


class CallSnapshots:
    """``every``: the step's setting (None: off, and this does nothing); ``memory``: its budget setting;
    ``restarts``: the step's (why snapshots are off, for the ranks); ``base``: the task's private base."""

    def __init__(self, client: GangClient, index: int, every: Optional[int], memory: Optional[float],
                 bind: str, restarts: int = 0, base: Optional[str] = None) -> None:
        self.client = client
        self.index = index
        self.every = every
        self.memory = memory
        self.bind = bind  # the address this node's peers reach it at
        self.restarts = restarts
        self.base = base
        self.store: Optional[SnapshotStore] = None
        self._directory: Optional[StepDir] = None
        self._told: Optional[msg.SnapshotPeers] = None  # the peers the store was last given
        self._last: Optional[tuple] = None  # the store's latest load, once reported
        self._said = False  # that the gang does not grow back (sharded state)
        self._start: Tuple[int, Optional[int]] = (0, None)  # the running start, and the newest step before it

    def open(self) -> Optional[int]:
        """The store started; the port its peers reach it at (None: off, or no peer channel)."""
        if self.every is None:
            return None
        from ..snapshots.node import SnapshotStore  # a step with snapshots off never loads them

        try:
            self._directory = StepDir(self.base)  # a socket path of any length binds (host/unix_socket.py)
            self.store = SnapshotStore(self._directory.path, budget=budget_for(self.memory),
                                       peer=self._key(), host=self.bind)
        except OSError as e:  # no room for a socket, or a platform without it: training goes on without
            say("call %d: in-memory snapshots are off on this node: %s" % (self.index + 1, e))
            self.close()
            return None
        return self.store.port

    def _key(self) -> Any:
        from ..snapshots.node import PeerKey

        client = self.client
        return PeerKey(client.secret, client.config.gang_id, client.node_index) if client.secret else None

    def environ(self) -> Dict[str, str]:
        """What every start's ranks get: the store's socket, the trainers' interval ("0": from a save's cost);
        with no store, why not (``snapshot.save``/``load`` say it once, in words, not by a variable's name)."""
        if self.store is None:
            why = OFF_ON_NODE if self.every is not None else OFF_BY_SETTING if self.restarts else OFF_NO_RESTARTS
            return {SNAPSHOTS_OFF_ENV: why}
        return dict(self.store.environ(), **{SNAPSHOT_EVERY_ENV: str(self.every or 0)})

    def follow(self) -> None:
        """The store told where its peers are, when the gang said something new (cheap when not)."""
        told = self.client.news.snapshot_peers(self.index)
        if self.store is None or told is None or told == self._told:
            return
        self._told = told
        self.store.peers_changed(told.buddy, [told.source] if told.source else [])

    def started(self, restart: int) -> None:
        """Start ``restart`` of the ranks begins here (the last one's ranks are gone)."""
        self._start = (restart, self.store.newest() if self.store is not None else None)
        if self.store is not None:
            self.store.new_start()

    def trained_at(self) -> Optional[float]:
        """When the running start's ranks committed their first snapshot: training again, for the ledger."""
        return self.store.first_saved_at() if self.store is not None else None

    def saved_in(self) -> Optional[int]:
        """The running start, once its ranks committed a snapshot newer than any before it (a restart point
        the gang may grow back at, losing little); None before. None while they save shards
        (``replicated=False``): a gang of another size cannot load a shard, so a regrowth would resume from the
        user's checkpoint, and the gang trains on at its size instead."""
        if self.store is None:
            return None
        restart, before = self._start
        newest = self.store.newest()
        if newest is None or (before is not None and newest <= before):
            return None
        return None if self._sharded() else restart

    def _sharded(self) -> bool:
        """Whether the running start's ranks save shards here; node 0, whose ranks saw the gang shrink, says
        once that it does not grow back."""
        assert self.store is not None
        sharded, world, seen = self.store.sharded()
        if sharded and world is not None and max(seen) > world and self.client.node_index == 0 and not self._said:
            self._said = True
            say("call %d: the gang does not grow back to %d ranks: its ranks' snapshots are shards of %d ranks "
                "(`save(..., replicated=False)`), which %d ranks cannot load, so growing back would resume from "
                "your checkpoint" % (self.index + 1, max(seen), world, max(seen)))
        return sharded

    def resumed(self) -> Optional[Resumed]:
        """Where the latest start's ranks resumed from memory, if they did."""
        loaded = self.store.last_load() if self.store is not None else None
        if loaded is None or loaded is self._last:
            return None
        self._last = loaded
        step, source, newest, saved_at = loaded
        told = self._told
        node = told.source_node if source is not None and told is not None else None
        return Resumed(step, node, max(step, newest), saved_at if source is None else None)

    def close(self) -> None:
        """Every snapshot freed, the socket's directory removed."""
        store, self.store = self.store, None
        if store is not None:
            store.close()
        directory, self._directory = self._directory, None
        if directory is not None:
            directory.close()
