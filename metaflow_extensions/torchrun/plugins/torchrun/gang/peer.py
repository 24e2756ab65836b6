"""One connection to the gang service, as its one thread holds it: nothing
blocks, so a slow reader costs the service its own bounded outbox only.
Whether it is alive is judged by what it sends, not how fast it reads.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import List, Optional

from . import wire
from .auth import new_nonce

# Bytes queued for one peer, at most: past it, the peer is not reading at all and what is sent to it is lost.
MAX_OUTBOX = 4 << 20


@dataclass(eq=False)
class Peer:
    sock: socket.socket
    nonce: bytes = field(default_factory=new_nonce)
    reader: wire.LineReader = field(
        default_factory=lambda: wire.LineReader(max_line=wire.PRE_AUTH_LINE, strict=True))
    node: Optional[int] = None  # set once the peer proved it holds the secret
    host: str = "?"
    connected: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    # When its ranks last wrote output, and last advanced a step while they report
    # progress (monotonic, from its heartbeats); None outside a call's job.
    last_output: Optional[float] = None
    last_advance: Optional[float] = None
    saved: Optional[int] = None  # the latest start of its ranks that committed a snapshot, as its heartbeats say
    outbox: bytearray = field(default_factory=bytearray)

    def queue(self, data: bytes) -> None:
        if len(self.outbox) + len(data) <= MAX_OUTBOX:
            self.outbox += data

    def flush(self) -> bool:
        """False when the connection is gone."""
        while self.outbox:
            try:
                n = self.sock.send(self.outbox)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            if n <= 0:
                return True
            del self.outbox[:n]
        return True

    def read(self) -> Optional[List[wire.Message]]:
        """None when the peer hung up or broke the line rules."""
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            return None
        if not data:
            return None
        self.last_seen = time.monotonic()
        try:
            return self.reader.feed(data)
        except wire.ProtocolError:
            return None


def address(sock: socket.socket) -> str:
    try:
        return "%s:%s" % sock.getpeername()[:2]
    except OSError:
        return "?"
