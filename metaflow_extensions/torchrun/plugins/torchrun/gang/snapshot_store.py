"""A node's snapshot store: the ranks' training state, held in the task's own memory.

The task (or its warm process) runs it for the step; it outlives the ranks, so a restarted
rank reads back the state its predecessor saved a step ago. The ranks reach it over a Unix
socket in a private (0700) directory, its path in ``procs/names.SNAPSHOT_ENV``: nothing of it
is on a disk or a tmpfs. With a ``PeerKey`` it also listens on TCP for its peers, pushes each
complete shard to its buddy node, and fetches a key it does not hold (a spare in a lost node's
place) from its peers.

A rank's requests (``procs/snapshot.py``'s ``StoreClient``), each a frame of ``snapshot_wire``:
``plan`` (will a snapshot of this size fit?), ``put`` (a snapshot: ``go``, its bytes, ``ok``),
``steps`` (the steps held for a key, fetched from a peer first where none is), ``get``.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..host.private import make_private
from ..host.unix_socket import bind_unix
from ..procs import snapshot_wire as wire
from ..procs.names import SNAPSHOT_ENV
from .snapshot_peer import Address, Listener, PeerKey, PeerRefused, connect, fetch, stop_listening
from .snapshot_pusher import Pusher
from .snapshot_shelf import Shelf, default_budget

SOCKET_NAME = "snapshot.sock"
MAX_STEP = 1 << 53


def _say(text: str) -> None:
    sys.stderr.write("metaflow-torchrun: %s\n" % text)


class SnapshotStore:
    """``directory``: a private directory of the task's (made 0700 if new); ``budget``: bytes (default: a
    quarter of the host's available memory); ``peer``: the gang's secret and this node's index, to
    replicate; ``host``: the address its peers reach it at (``port``: theirs to read)."""

    def __init__(self, directory: str, budget: Optional[int] = None, peer: Optional[PeerKey] = None,
                 host: str = "0.0.0.0", buddy: Optional[Address] = None, peers: Sequence[Address] = (),
                 say: Callable[[str], None] = _say) -> None:
        self.shelf = Shelf(default_budget() if budget is None else budget)
        self.path = os.path.join(make_private(directory), SOCKET_NAME)
        self._say = say
        self._peer = peer
        self._peers = list(peers)
        self._fetch_lock = threading.Lock()
        self._conns: List[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        bind_unix(self._sock, self.path)
        self._sock.listen(64)
        self._listener = Listener(self.shelf, peer, host) if peer else None
        self._pusher = Pusher(peer, buddy, say) if peer else None
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
        try:
            while True:
                header = wire.recv_header(sock)
                if header is None:
                    return
                self._answer(sock, header)
        except (OSError, wire.WireError):
            pass  # a rank gone (killed mid-save: what it sent is dropped) or broken: its connection ends
        finally:
            wire.close_quietly(sock)
            with self._lock:
                if sock in self._conns:
                    self._conns.remove(sock)

    def _answer(self, sock: socket.socket, header: Dict[str, Any]) -> None:
        op, key = header.get("op"), wire.key_field(header)
        if op == "put":
            self._put(sock, key, header)
        elif op == "plan":
            why = self.shelf.plan(key, wire.int_field(header, "size", 0, 1 << 48))
            wire.send_frame(sock, {"ok": why is None, "why": why or "", "budget": self.budget})
        elif op == "steps":
            source = self._fetch_missing(key)
            wire.send_frame(sock, {"steps": self.shelf.steps(key), "from": source})
        elif op == "get":
            held = self.shelf.get(key, wire.int_field(header, "step", 0, MAX_STEP))
            wire.send_frame(sock, {"size": held.size if held else -1}, held.blob if held else None)
        else:
            raise wire.WireError("an unknown request")

    def _put(self, sock: socket.socket, key: str, header: Dict[str, Any]) -> None:
        step = wire.int_field(header, "step", 0, MAX_STEP)
        size = wire.int_field(header, "size", 64, 1 << 48)
        ticket = self.shelf.begin(key, size)
        if ticket is None:
            wire.send_frame(sock, {"go": False, "why": "over the node's snapshot budget of %d bytes" % self.budget})
            return
        wire.send_frame(sock, {"go": True})
        try:
            blob = wire.recv_body(sock, size)
        except BaseException:
            self.shelf.abandon(ticket)  # torn: the key's previous snapshots stand
            raise
        held = self.shelf.finish(ticket, step, blob)
        if self._pusher and key.startswith("rank-"):
            self._pusher.offer(held)  # replicated state: every node holds its own copy already
        wire.send_frame(sock, {"ok": True})

    def _fetch_missing(self, key: str) -> Optional[int]:
        """A key this node holds nothing of (a spare's first start) is copied from the first peer that has it;
        the answer is that peer's index in ``peers`` (the runtime names the node), None if held here."""
        with self._fetch_lock:
            if self.shelf.steps(key) or not self._peer:
                return None
            with self._lock:
                peers = list(self._peers)
            for index, address in enumerate(peers):
                if self._copy_from(address, key):
                    return index
            return None

    def _copy_from(self, address: Address, key: str) -> bool:
        assert self._peer is not None
        try:
            channel = connect(self._peer, address)
        except PeerRefused as e:
            self._say("the snapshot store at %s:%d: %s" % (address[0], address[1], e))
            return False
        try:
            copies = fetch(channel, key, self.budget)
        except (OSError, PeerRefused, wire.WireError) as e:
            self._say("fetching %s from %s:%d: %s" % (key, address[0], address[1], e))
            return False
        finally:
            channel.close()
        for step, blob in copies:
            ticket = self.shelf.begin(key, len(blob))
            if ticket is not None:
                self.shelf.finish(ticket, step, blob)
        return bool(self.shelf.steps(key))

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
        self.shelf.clear()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def __enter__(self) -> "SnapshotStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

