"""One connection to the gang service, as the service's one thread holds it.

Nothing here blocks: reads take what the socket has, and writes go into a
bounded outbox that the loop flushes when the socket can take more. A peer
that reads slowly therefore costs the service nothing but its own outbox; it
never stalls the loop for the others. Whether such a peer is still alive is
judged by what it sends (the heartbeat rules), not by how fast it reads.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import List, Optional

from . import wire
from .auth import new_nonce

# Bytes queued for one peer, at most: a peer that has not read this much is not
# reading at all (a live node's outbox holds a few small messages). Past it,
# the peer is dropped, and a node that was dropped is lost to the gang.
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
    # When this node's ranks last wrote output (monotonic, this host's clock),
    # from its heartbeats while a call runs; None outside a call's job.
    last_output: Optional[float] = None
    # When any of its ranks last advanced a step (monotonic), while they report
    # progress: hang_timeout's clock then.
    last_advance: Optional[float] = None
    outbox: bytearray = field(default_factory=bytearray)
    sent: int = 0  # bytes written to this peer, in all

    def queue(self, data: bytes) -> bool:
        """Add to the outbox; False when it would pass ``MAX_OUTBOX``."""
        if len(self.outbox) + len(data) > MAX_OUTBOX:
            return False
        self.outbox += data
        return True

    def flush(self) -> bool:
        """Write what the socket takes now; False when the connection is gone."""
        while self.outbox:
            try:
                n = self.sock.send(self.outbox)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            if n <= 0:
                return True
            self.sent += n
            del self.outbox[:n]
        return True

    def read(self) -> Optional[List[wire.Message]]:
        """What arrived; None when the peer hung up or broke the line rules."""
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
