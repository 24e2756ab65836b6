"""A node's second way to hear the control while its connection is silent: after a
flap TCP's backoff can hold the connection's resends back for about as long as the
cut lasted, while a fresh connection's SYN leaves at once. Probes stand in for the
connection for ``link_timeout`` at most: one silent longer is dead (a firewall or NAT
lost its state). The measurements: docs/failures.md.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from ..cause import Cause, CauseKind
from ..host import log
from ..base import timeouts
from . import auth as gang_auth
from . import messages as msg
from . import wire
from .config import GangConfig

_log = log.get("gang.client")


class Hearing:
    """When this node last heard the control: on its connection, and by any means; each assigned whole."""

    def __init__(self) -> None:
        self.link = self.any = time.monotonic()

    def on_link(self) -> None:
        self.link = now = time.monotonic()
        self.any = max(self.any, now)

    def on_probe(self) -> None:
        self.any = max(self.any, time.monotonic())

    def verdict(self, config: GangConfig, now: float) -> Optional[Cause]:
        if now - self.any > config.heartbeat_timeout:  # from inside a partition, no side can tell which is cut
            return Cause(CauseKind.CONTROL_UNRESPONSIVE, "heard nothing from the control node (node 0) for %.0fs "
                         "(heartbeat_timeout=%gs): it is frozen, or it or this node is cut off from the network"
                         % (now - self.any, config.heartbeat_timeout), node_index=0)
        if now - self.link > config.link_timeout:
            return Cause(CauseKind.CONTROL_UNRESPONSIVE,
                         "the connection to the control node (node 0) carried nothing for %.0fs while the control "
                         "still answered on fresh connections: it is dead (a firewall or NAT between the nodes "
                         "lost it)" % (now - self.link), node_index=0)
        return None


@dataclass
class Prober:
    config: GangConfig
    host: str
    port: int
    node_index: int
    secret: bytes = field(repr=False)
    hearing: Hearing
    on_cause: Callable[[Cause], None]
    done: Callable[[], bool]
    closing: threading.Event
    sent: int = 0  # probes, for the debug log

    def due(self, now: float) -> bool:
        """Whether the control has been silent long enough to probe it."""
        return now - self.hearing.any >= self.config.probe_after and not self.closing.is_set() and not self.done()

    def run(self) -> None:
        """One silence: probes every heartbeat interval until the control is heard again. Started by the
        heartbeat loop only when a silence begins, so a healthy node keeps no third thread (at 4,096
        simulated nodes in one harness, 4,096 idle threads waking every interval slowed every reader)."""
        period = self.config.heartbeat_interval
        while self.due(time.monotonic()):
            began = time.monotonic()
            self.sent += 1
            if self.once(period):
                _log.debug("node %d: probe %d answered after %.1f s of silence on the connection", self.node_index,
                           self.sent, began - self.hearing.link)
            self.closing.wait(max(0.0, began + period - time.monotonic()))

    def once(self, connect_timeout: float) -> bool:
        """``connect_timeout`` is short: a lost SYN is resent by the next probe, not after Linux's 1 s."""
        try:
            sock = socket.create_connection((self.host, self.port), timeout=connect_timeout)
        except OSError:
            return False
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(timeouts.PROBE_WAIT)
            lines = _Lines(sock)
            server_nonce = gang_auth.read_challenge(lines.next())
            client_nonce = gang_auth.new_nonce()
            wire.send(sock, gang_auth.probe(self.secret, self.config.gang_id, server_nonce, self.node_index,
                                            client_nonce).to_wire())
            welcome = gang_auth.check_welcome(self.secret, self.config.gang_id, server_nonce, client_nonce,
                                              self.node_index, lines.next())
        except (OSError, ValueError):  # AuthError and ProtocolError are ValueErrors
            return False
        finally:
            wire.close_quietly(sock)
        self.hearing.on_probe()
        if welcome.cause is not None:
            self.on_cause(welcome.cause)
        return True


class _Lines:

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = wire.LineReader(max_line=wire.MAX_LINE, strict=True)
        self.ready: List[wire.Message] = []

    def next(self) -> msg.WireDict:
        while not self.ready:
            data = self.sock.recv(4096)
            if not data:
                raise ValueError("connection closed")
            self.ready.extend(self.reader.feed(data))
        return self.ready.pop(0)
