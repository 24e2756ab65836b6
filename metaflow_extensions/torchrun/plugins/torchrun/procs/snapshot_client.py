"""A rank's connection to its node's snapshot store (``gang/snapshot_store.py``), over the Unix
socket whose path the task puts in ``SNAPSHOT_ENV``. One per thread: the saver's thread puts,
the rank's own thread plans and loads. A broken connection is opened again at the next request.
"""

from __future__ import annotations

import socket
from typing import Any, Dict, List, Optional, Tuple

from ..host.unix_socket import connect_unix
from . import snapshot_wire as wire

MAX_BLOB = 1 << 40  # what a rank takes back from its own store, at most
TIMEOUT = 120.0  # a store fetching a key from a peer answers after the copy


class StoreError(ConnectionError):
    """The store could not be reached or answered out of protocol."""


class StoreClient:
    def __init__(self, path: str) -> None:
        self.path = path
        self._sock: Optional[socket.socket] = None

    def _ask(self, header: Dict[str, Any], body: Optional[Any] = None) -> Dict[str, Any]:
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(TIMEOUT)
                connect_unix(sock, self.path)
                self._sock = sock
            wire.send_frame(self._sock, header, body)
            answer = wire.recv_header(self._sock)
            if answer is None:
                raise wire.WireError("the store closed the connection")
            return answer
        except (OSError, wire.WireError) as e:
            self.close()
            raise StoreError("the node's snapshot store (%s): %s" % (self.path, e)) from None

    def plan(self, key: str, size: int) -> Tuple[Optional[str], int]:
        """(None or why a snapshot of ``size`` does not fit, the store's budget)."""
        answer = self._ask({"op": "plan", "key": key, "size": size})
        why, budget = answer.get("why"), answer.get("budget")
        return (None if answer.get("ok") is True else str(why)[:1000]), budget if isinstance(budget, int) else 0

    def put(self, key: str, step: int, blob: memoryview) -> Optional[str]:
        """None once the store holds it whole; else the store's reason."""
        answer = self._ask({"op": "put", "key": key, "step": step, "size": len(blob)})
        if answer.get("go") is not True:
            return str(answer.get("why", "refused"))[:1000]
        try:
            assert self._sock is not None
            self._sock.sendall(blob)
            done = wire.recv_header(self._sock)
        except (OSError, wire.WireError) as e:
            self.close()
            raise StoreError("the node's snapshot store (%s): %s" % (self.path, e)) from None
        return None if done and done.get("ok") is True else "not kept"

    def steps(self, key: str) -> Tuple[List[int], Optional[int]]:
        """The steps held complete for ``key`` (after a copy from a peer where none were), and that peer."""
        answer = self._ask({"op": "steps", "key": key})
        steps, source = answer.get("steps"), answer.get("from")
        if not isinstance(steps, list) or len(steps) > 8 or not all(_count(s) for s in steps):
            raise StoreError("the node's snapshot store answered steps out of protocol")
        return list(steps), source if _count(source) else None

    def get(self, key: str, step: int) -> Optional[bytearray]:
        answer = self._ask({"op": "get", "key": key, "step": step})
        size = answer.get("size")
        if size == -1:
            return None
        try:
            size = wire.int_field(answer, "size", 0, MAX_BLOB)
            assert self._sock is not None
            return wire.recv_body(self._sock, size)
        except (OSError, wire.WireError) as e:
            self.close()
            raise StoreError("the node's snapshot store (%s): %s" % (self.path, e)) from None

    def close(self) -> None:
        sock, self._sock = self._sock, None
        wire.close_quietly(sock)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 53
