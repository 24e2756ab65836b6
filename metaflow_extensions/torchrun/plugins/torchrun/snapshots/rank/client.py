"""A rank's connection to its node's snapshot store (``snapshots/node/store.py``), over the Unix
socket whose path the task puts in ``SNAPSHOT_ENV``. One per thread: the saver's (the rank's own
thread for CPU state, its copy thread for CUDA state), and one for a load. A broken connection is
opened again at the next request.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ...host.unix_socket import connect_unix
from . import memory, wire

MAX_BLOB = 1 << 40  # what a rank takes back from its own store, at most
TIMEOUT = 120.0  # the longest the store is silent: fetching a key from a peer, it says so every few seconds


class StoreError(ConnectionError):
    """The store could not be reached or answered out of protocol."""


@dataclass(frozen=True)
class Granted:
    """A slot to write the next snapshot in: its fd only where this connection has not had it yet."""

    slot: int
    capacity: int
    fd: Optional[int]
    dropped: List[int]  # slots closed since: unmap them


@dataclass(frozen=True)
class Loaded:
    """A snapshot's bytes, copied into the rank's own memory, and where they came from."""

    blob: bytearray
    source: Optional[int]  # the peer's index in the store's peers, None for this node's own copy
    node: Optional[int]  # that peer's node index
    newest: Optional[int]  # the newest step the store held for any key


class StoreClient:
    def __init__(self, path: str) -> None:
        self.path = path
        self._sock: Optional[socket.socket] = None

    def _ask(self, header: Dict[str, Any]) -> Dict[str, Any]:
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(TIMEOUT)
                connect_unix(sock, self.path)
                self._sock = sock
            wire.send_frame(self._sock, header)
            answer = wire.recv_header(self._sock)
            while answer is not None and answer.get("fetching") is True:  # a spare's copy on its way from a peer
                answer = wire.recv_header(self._sock)
            if answer is None:
                raise wire.WireError("the store closed the connection")
            return answer
        except (OSError, wire.WireError) as e:
            raise self._broken(e) from None

    def _broken(self, e: Exception) -> StoreError:
        self.close()
        return StoreError("the node's snapshot store (%s): %s" % (self.path, e))

    def _fd(self) -> int:
        try:
            assert self._sock is not None
            return memory.recv_fd(self._sock)
        except OSError as e:
            raise self._broken(e) from None

    def plan(self, key: str, size: int, pinned: int, ranks: int) -> Tuple[Optional[str], int, bool]:
        """(None or why the node's ``ranks`` local ranks' snapshots of ``size`` do not fit, each also holding
        ``pinned`` bytes of its own; the store's budget; whether another rank of the node said why already)."""
        answer = self._ask({"op": "plan", "key": key, "size": size, "pinned": pinned, "ranks": ranks})
        why, budget = answer.get("why"), answer.get("budget")
        return ((None if answer.get("ok") is True else str(why)[:1000]), budget if isinstance(budget, int) else 0,
                answer.get("said") is True)

    def slot(self, key: str, size: int) -> Tuple[Optional[Granted], List[int], str]:
        """(a slot of at least ``size`` bytes or None, the slots closed since, why there is none)."""
        answer = self._ask({"op": "slot", "key": key, "size": size})
        dropped = answer.get("dropped")
        dropped = [i for i in dropped if _count(i)] if isinstance(dropped, list) else []
        ident, capacity = answer.get("slot"), answer.get("capacity")
        if not (isinstance(ident, int) and _count(ident) and ident and isinstance(capacity, int)
                and _count(capacity) and capacity >= size):
            return None, dropped, str(answer.get("why", "refused"))[:1000]
        fd = self._fd() if answer.get("fd") is True else None
        return Granted(ident, capacity, fd, dropped), dropped, ""

    def commit(self, key: str, slot: int, step: int, size: int, start: int = 0) -> Optional[str]:
        """None once the store holds the slot's snapshot as the key's newest, taken by the rank's ``start``;
        else the store's reason."""
        answer = self._ask({"op": "commit", "key": key, "slot": slot, "step": step, "size": size, "start": start})
        return None if answer.get("ok") is True else str(answer.get("why", "not kept"))[:1000]

    def steps(self, key: str) -> Tuple[List[int], Optional[int], Optional[int]]:
        """(the steps held complete for ``key``, after a copy from a peer where none were; that peer's node;
        the newest step the store holds for any key)."""
        answer = self._ask({"op": "steps", "key": key})
        steps, node, newest = answer.get("steps"), answer.get("node"), answer.get("newest")
        if not isinstance(steps, list) or len(steps) > 8 or not all(_count(s) for s in steps):
            raise StoreError("the node's snapshot store answered steps out of protocol")
        return list(steps), node if _count(node) else None, newest if _count(newest) else None

    def held(self, key: str) -> List[Tuple[int, int]]:
        """The (start, step) of each snapshot held complete for ``key`` (fetched from a peer where none was)."""
        held = self._ask({"op": "steps", "key": key}).get("held")
        if not isinstance(held, list) or len(held) > 8 or not all(
                isinstance(h, list) and len(h) == 2 and _count(h[0]) and _count(h[1]) for h in held):
            raise StoreError("the node's snapshot store answered steps out of protocol")
        return [(h[0], h[1]) for h in held]

    def get(self, key: str, step: int, start: Optional[int] = None) -> Optional[Loaded]:
        """The snapshot of ``step`` (taken by ``start`` where given) copied out of its slot (one copy); None if
        the store holds it no more."""
        ask: Dict[str, Any] = {"op": "get", "key": key, "step": step}
        if start is not None:
            ask["start"] = start
        answer = self._ask(ask)
        if answer.get("size") == -1:
            return None
        try:
            size = wire.int_field(answer, "size", 0, MAX_BLOB)
        except wire.WireError as e:
            raise self._broken(e) from None
        fd = self._fd()
        try:
            blob = memory.copy_out(fd, size)
        except OSError as e:
            raise StoreError("the node's snapshot store (%s): %s" % (self.path, e)) from None
        finally:
            os.close(fd)
        source, node, newest = answer.get("from"), answer.get("node"), answer.get("newest")
        return Loaded(blob, source if _count(source) else None, node if _count(node) else None,
                      newest if _count(newest) else None)

    def close(self) -> None:
        sock, self._sock = self._sock, None
        wire.close_quietly(sock)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 53
