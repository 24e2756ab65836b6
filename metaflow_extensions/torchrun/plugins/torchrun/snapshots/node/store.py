"""A node's snapshot store: the ranks' training state, held in the task's own memory.

The task (or its warm process) runs it for the step; it outlives the ranks, so a restarted
rank reads back the state its predecessor saved a step ago. The ranks reach it over a Unix
socket in a private (0700) directory, its path in ``procs/names.SNAPSHOT_ENV``: nothing of it
is on a disk or a tmpfs. With a ``PeerKey`` it also listens on TCP for its peers, pushes each
complete shard to its buddy node, and fetches a key it does not hold (a spare in a lost node's
place) from its peers.

A snapshot is written by the rank straight into the store's memory: the store makes each slot
(a sealed memfd, ``shelf``) and passes its fd over the socket; the rank maps it once and
copies its tensors in at every save, then commits. Nothing is copied between them, and the store
reads no byte of a snapshot but its manifest (checked against bounds at ``commit``) until it sends
one to a peer, which is when its digest is computed.

A rank's requests (``snapshots/rank/client.py``'s ``StoreClient``), each a frame of
``wire``: ``plan`` (will a snapshot of this size fit?), ``slot`` (a slot to write the key's
next snapshot in: its id, and its fd the first time this connection is given it; the ids of slots
closed since, to unmap), ``commit`` (that slot holds step S of the rank's start K, whole), ``steps``
(the (start, step) held for a key, fetched from a peer first where none is, and the newest step of any
key), ``get`` (a read-only fd of a (start, step)'s slot, held as it is until the connection's next request).

The world size is the ranks': the first request of a sharded key of another size than the last drops
every shard of other sizes (``Shelf.drop_worlds``), here and, as each node's ranks ask in turn, on every
node; a peer's push of another size is refused after that.
"""

from __future__ import annotations

import itertools
import os
import socket
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from ...base import defaults as DEFAULTS
from ...host.private import make_private
from ...host.unix_socket import bind_unix
from ...procs.names import SNAPSHOT_ENV
from ..rank import codec, memory, wire
from .peer import Address, Listener, PeerKey, PeerRefused, connect, fetch, stop_listening
from .pusher import Pusher
from .budget import Budget, share_of
from .shelf import Shelf, Slot, Source, megabytes

SOCKET_NAME = "snapshot.sock"
MAX_STEP = 1 << 53
MAX_START = 1 << 31
KEEPALIVE = 2.0  # seconds between the frames that tell a rank its key is still being fetched from a peer


def _say(text: str) -> None:
    sys.stderr.write("metaflow-torchrun: %s\n" % text)


class SnapshotStore:
    """``directory``: a private directory of the task's (made 0700 if new); ``budget``: bytes, or bytes and
    where they came from (default: a share of the memory the container has room for, ``budget.share_of``);
    ``peer``: the gang's secret and this node's index, to replicate; ``host``: the address its peers reach
    it at (``port``: theirs to read)."""

    def __init__(self, directory: str, budget: Optional[Union[int, Budget]] = None, peer: Optional[PeerKey] = None,
                 host: str = "0.0.0.0", buddy: Optional[Address] = None, peers: Sequence[Address] = (),
                 say: Callable[[str], None] = _say) -> None:
        if budget is None:
            budget = share_of(DEFAULTS.SNAPSHOT_MEMORY_SHARE)
        chosen = budget if isinstance(budget, Budget) else Budget(budget, "")
        self.shelf = Shelf(chosen.bytes, chosen.source)
        self.path = os.path.join(make_private(directory), SOCKET_NAME)
        self._say = say
        self._peer = peer
        self._peers = list(peers)
        self._fetching: Dict[str, threading.Lock] = {}  # a key being fetched: one fetch per key, keys at once
        self._conns: List[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._off = memory.unavailable()  # no sealed memfd here: every rank is told so at its first save
        self._last_load: Optional[Tuple[int, Optional[int], int, float]] = None
        self._first_saved_at: Optional[float] = None  # the current start's ranks' first commit here
        self._world: Optional[int] = None  # the world size of the sharded keys the ranks ask for
        self._sharded = False  # the current start's ranks committed a shard
        self._worlds_seen: Set[int] = set()
        self._ids = itertools.count(1)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        bind_unix(self._sock, self.path)
        self._sock.listen(64)
        self._listener = Listener(self.shelf, peer, host, admits=self._admits) if peer else None
        self._pusher = Pusher(peer, self.shelf, buddy, say) if peer else None
        threading.Thread(target=self._accept, name="snapshot-store", daemon=True).start()

    @property
    def budget(self) -> int:
        return self.shelf.budget

    @property
    def port(self) -> Optional[int]:
        """The TCP port its peers reach it at; None without a ``PeerKey``."""
        return self._listener.port if self._listener else None

    def environ(self) -> Dict[str, str]:
        """What the ranks' environment needs to reach it."""
        return {SNAPSHOT_ENV: self.path}

    def peers_changed(self, buddy: Optional[Address], peers: Sequence[Address]) -> None:
        """The gang changed (a swap): where shards go, and where a missing key is looked for."""
        with self._lock:
            self._peers = list(peers)
        if self._pusher:
            self._pusher.buddy_changed(buddy)

    def replicated(self, timeout: float) -> bool:
        """Whether every shard offered to the buddy so far has gone (tests, the benchmark)."""
        return self._pusher.idle(timeout) if self._pusher else True

    def newest(self) -> Optional[int]:
        """The newest step any key holds on this store (the gang's last save, as far as this node knows)."""
        return self.shelf.newest()

    def new_start(self) -> None:
        """The ranks start again (the last start's are gone): ``first_saved_at`` is of the new start's saves."""
        with self._lock:
            self._first_saved_at = None
            self._sharded = False

    def first_saved_at(self) -> Optional[float]:
        """When the current start's ranks first committed a snapshot here (wall clock): its first step done,
        where they save every step. A peer's copy, which does not come through a rank's commit, is not theirs."""
        with self._lock:
            return self._first_saved_at

    def sharded(self) -> Tuple[bool, Optional[int], Set[int]]:
        """(whether the current start's ranks committed a shard here, the world size the ranks ask for, every
        world size seen): a gang of another size cannot load this start's shards."""
        with self._lock:
            return self._sharded, self._world, set(self._worlds_seen)

    def last_load(self) -> Optional[Tuple[int, Optional[int], int, float]]:
        """(step, the peer's index in ``peers`` it was copied from or None, the newest step then, when it
        was committed here) of the latest snapshot a rank read: what the runtime's ledger counts as lost."""
        with self._lock:
            return self._last_load

    # -- the ranks' connections ----------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                if self._closed:
                    wire.close_quietly(sock)
                    return
                self._conns.append(sock)
            threading.Thread(target=self._serve, args=(sock,), name="snapshot-rank", daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        conn = _Conn(next(self._ids))
        try:
            while True:
                header = wire.recv_header(sock)
                conn.let_go(self.shelf)  # a get's slot is held until the rank's next request
                if header is None:
                    return
                self._answer(sock, conn, header)
        except (OSError, wire.WireError):
            pass  # a rank gone (killed mid-save: its slot was never committed) or broken: its connection ends
        finally:
            conn.let_go(self.shelf)
            self.shelf.abandon_owner(conn.id)
            wire.close_quietly(sock)
            with self._lock:
                if sock in self._conns:
                    self._conns.remove(sock)

    def _answer(self, sock: socket.socket, conn: "_Conn", header: Dict[str, Any]) -> None:
        op, key = header.get("op"), wire.key_field(header)
        self._world_of_ranks(key)
        if op == "slot":
            self._slot(sock, conn, key, wire.int_field(header, "size", 64, 1 << 48))
        elif op == "commit":
            why = self._commit(conn, key, header)
            wire.send_frame(sock, {"ok": why is None, "why": why or ""})
        elif op == "plan":  # the node's one decision for all its local ranks (``Shelf.plan``)
            why, made = self._off, True
            if why is None:
                why, made = self.shelf.plan(key, wire.int_field(header, "size", 0, 1 << 48),
                                            wire.int_field(header, "pinned", 0, 1 << 50),
                                            wire.int_field(header, "ranks", 1, 1 << 16))
            wire.send_frame(sock, {"ok": why is None, "why": why or "", "budget": self.budget, "said": not made})
        elif op == "steps":
            source = self._fetch_answering(sock, key)
            held = self.shelf.held(key)
            wire.send_frame(sock, {"steps": [step for _, step in held], "held": [list(h) for h in held],
                                   "from": source[0] if source else None, "node": source[1] if source else None,
                                   "newest": self.newest()})
        elif op == "get":
            start = wire.int_field(header, "start", 0, MAX_START) if "start" in header else None
            self._get(sock, conn, key, wire.int_field(header, "step", 0, MAX_STEP), start)
        else:
            raise wire.WireError("an unknown request")

    def _world_of_ranks(self, key: str) -> None:
        """A rank's sharded key of another world size than the last: the gang changed size, and every shard of
        another size goes, its memory returned (said once a change)."""
        world = wire.world_of(key)
        with self._lock:
            if world is None or world == self._world:
                return
            before, self._world = self._world, world
            self._worlds_seen.add(world)
        freed = self.shelf.drop_worlds(world)
        if before is not None and freed:
            self._say("the gang's ranks are %d now, not %d: this node's snapshots of other sizes are dropped (%s "
                      "returned)" % (world, before, megabytes(freed)))

    def _admits(self, key: str) -> bool:
        """A peer's copy of ``key`` is taken: replicated state, or a shard of the ranks' world size (or any
        before the ranks first asked)."""
        world = wire.world_of(key)
        with self._lock:
            return world is None or self._world is None or world == self._world

    def _slot(self, sock: socket.socket, conn: "_Conn", key: str, size: int) -> None:
        why = self._off or self.shelf.off or "over the node's snapshot budget of %d bytes" % self.budget
        try:
            slot = None if self._off else self.shelf.begin(key, size, owner=conn.id)
        except OSError as e:  # no memory for a memfd, or no fd left: this save is not kept, the next may be
            slot, why = None, "no snapshot slot could be made: %s" % e
        if slot is None:
            wire.send_frame(sock, {"slot": 0, "why": why, "dropped": conn.dropped(self.shelf)})
            return
        new = slot.id not in conn.sent
        conn.sent.add(slot.id)
        wire.send_frame(sock, {"slot": slot.id, "capacity": slot.capacity, "fd": new,
                               "dropped": conn.dropped(self.shelf)})
        if new:
            memory.send_fd(sock, slot.fd)

    def _commit(self, conn: "_Conn", key: str, header: Dict[str, Any]) -> Optional[str]:
        """None once the slot is the key's newest; else why not (the slot is then void, its bytes unread)."""
        slot = self.shelf.writing(wire.int_field(header, "slot", 1, 1 << 62), key, conn.id)
        step = wire.int_field(header, "step", 0, MAX_STEP)
        start = wire.int_field(header, "start", 0, MAX_START)
        if slot is None:
            return "no slot of %s being written by this rank (another rank of the key took it over?)" % key
        try:
            size = wire.int_field(header, "size", codec.HEADER_BYTES + codec.DIGEST_BYTES, slot.capacity)
            with memoryview(slot.map) as whole:
                written = codec.check(whole[:size], digest=False).step
            if written != step:
                raise codec.SnapshotError("the slot holds step %d, not %d" % (written, step))
        except (codec.SnapshotError, wire.WireError) as e:
            self.shelf.abandon(slot)
            return "not a whole snapshot: %s" % e
        self.shelf.finish(slot, step, size, start=start)
        with self._lock:
            self._first_saved_at = self._first_saved_at or slot.saved_at
            self._sharded = self._sharded or wire.world_of(key) is not None
        if self._pusher and key.startswith("rank-"):
            self._pusher.offer(key, step)  # replicated state: every node holds its own copy already
        return None

    def _get(self, sock: socket.socket, conn: "_Conn", key: str, step: int, start: Optional[int]) -> None:
        slot = self.shelf.pin(key, step, start)
        if slot is None:
            wire.send_frame(sock, {"size": -1})
            return
        conn.pins.append(slot)
        source, newest = slot.source, max(step, self.newest() or 0)
        with self._lock:
            self._last_load = (step, source[0] if source else None, newest, slot.saved_at)
        fd = memory.read_only(slot.fd)
        try:
            wire.send_frame(sock, {"size": slot.size, "from": source[0] if source else None,
                                   "node": source[1] if source else None, "newest": newest})
            memory.send_fd(sock, fd)
        finally:
            os.close(fd)

    def _fetch_answering(self, sock: socket.socket, key: str) -> Optional[Source]:
        """``_fetch_missing``, with a frame to the rank every ``KEEPALIVE`` seconds while it runs: a fetch takes as
        long as the state's bytes take on the link (each chunk bounded by the peer's I/O timeout), and the rank's
        own timeout bounds a silence, not the copy."""
        if self.shelf.steps(key) or not self._peer:
            return None
        found: List[Optional[Source]] = []
        thread = threading.Thread(target=lambda: found.append(self._fetch_missing(key)), name="snapshot-fetch",
                                  daemon=True)
        thread.start()
        thread.join(KEEPALIVE)
        while thread.is_alive():
            wire.send_frame(sock, {"fetching": True})
            thread.join(KEEPALIVE)
        return found[0] if found else None

    def _fetch_missing(self, key: str) -> Optional[Source]:
        """A key this node holds nothing of (a spare's first start) is copied from the first peer that has it:
        (that peer's index in ``peers``, its node index), None if held here or nowhere. The node's ranks fetch
        their keys at once, each key once."""
        with self._lock:
            lock = self._fetching.setdefault(key, threading.Lock())
        with lock:
            if self.shelf.steps(key) or not self._peer:
                return None
            with self._lock:
                peers = list(self._peers)
            for index, address in enumerate(peers):
                node = self._copy_from(index, address, key)
                if node is not None:
                    return index, node
            return None

    def _copy_from(self, index: int, address: Address, key: str) -> Optional[int]:
        assert self._peer is not None
        try:
            channel = connect(self._peer, address)
        except PeerRefused as e:
            self._say("the snapshot store at %s:%d: %s" % (address[0], address[1], e))
            return None
        try:
            node = fetch(channel, key, self.shelf, index)
        except (OSError, PeerRefused, wire.WireError) as e:
            self._say("fetching %s from %s:%d: %s" % (key, address[0], address[1], e))
            node = None
        finally:
            channel.close()
        return node if self.shelf.steps(key) else None

    def close(self) -> None:
        """Everything freed: the sockets closed, every snapshot dropped."""
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), []
        stop_listening(self._sock)
        for sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._pusher:
            self._pusher.close()
        if self._listener:
            self._listener.close()
        self.shelf.clear()  # every memfd closed
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def __enter__(self) -> "SnapshotStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()



class _Conn:
    """One rank's connection: the slots whose fd it was given, the slots its reads hold."""

    def __init__(self, ident: int) -> None:
        self.id = ident
        self.sent: Set[int] = set()
        self.pins: List[Slot] = []

    def dropped(self, shelf: Shelf) -> List[int]:
        """The slots it was given that are closed now: the rank unmaps them."""
        gone = self.sent - shelf.alive(self.sent)
        self.sent -= gone
        return sorted(gone)

    def let_go(self, shelf: Shelf) -> None:
        pins, self.pins = self.pins, []
        for slot in pins:
            shelf.unpin(slot)
