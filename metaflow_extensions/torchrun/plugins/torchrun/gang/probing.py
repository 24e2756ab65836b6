"""A node's second way to hear the control while its connection is silent.

A segment TCP lost is resent after the retransmission timeout, doubled at each
loss: on Linux 0.2, 0.6, 1.4, 3.0, 6.2, 12.6 s after it was first sent, later
under load. So after the link comes back, the gang's connection can stay
silent for up to about the cut's length again: a 5 s flap reads as 6 to 8 s
of silence, a 10 s one as over 13 s. A fresh connection is not held back by
that backoff: its SYN leaves at once.

So a node that has heard nothing from the control for ``probe_after`` (two
heartbeat intervals) says it is still here on a fresh connection, once per
heartbeat interval, one probe at a time: the control's challenge, a ``probe``
proving the secret as a hello does (``auth.probe``), the service's
``welcome``, then the connection closes. The service counts the probe as
hearing from that node (its own entry: O(1)); the node counts the welcome as
hearing from the control, and takes the gang's cause from it, if the gang is
over. During the cut every probe's SYN is lost, so a cut longer than
``heartbeat_timeout`` still ends every node; from inside a partition, a probe
tells no one which side was cut.

The connection stays the measure of last resort: the messages ride it, so
probes stand in for it for at most ``link_timeout`` (a cut shorter than
``heartbeat_timeout`` is resent within about twice its length). A connection
silent longer, while probes get through, is dead (a firewall or NAT that lost
its state): this node then stops as for any silence.
"""

from __future__ import annotations

import socket
import threading
import time
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
    """When this node last heard the control: on its connection (``link``)
    and by any means (``any``, a probe's answer too). Each is one float,
    assigned whole by the reader or the prober thread."""

    def __init__(self) -> None:
        self.link = self.any = time.monotonic()

    def on_link(self) -> None:
        self.link = now = time.monotonic()
        self.any = max(self.any, now)

    def on_probe(self) -> None:
        self.any = max(self.any, time.monotonic())

    def verdict(self, config: GangConfig, now: float) -> Optional[Cause]:
        """The silence that ends the gang on this node, or None: nothing heard
        for ``heartbeat_timeout``, or nothing on the connection for ``link_timeout``."""
        if now - self.any > config.heartbeat_timeout:
            return control_silent(now - self.any, config.heartbeat_timeout)
        if now - self.link > config.link_timeout:
            return Cause(CauseKind.CONTROL_UNRESPONSIVE,
                         "the connection to the control node (node 0) carried nothing for %.0fs while the control "
                         "still answered on fresh connections: it is dead (a firewall or NAT between the nodes "
                         "lost it)" % (now - self.link), node_index=0)
        return None


def control_silent(silent: float, heartbeat_timeout: float) -> Cause:
    """From inside a partition this node cannot tell which side is cut."""
    return Cause(CauseKind.CONTROL_UNRESPONSIVE,
                 "heard nothing from the control node (node 0) for %.0fs (heartbeat_timeout=%gs): it is frozen, "
                 "or it or this node is cut off from the network" % (silent, heartbeat_timeout), node_index=0)


class Prober:
    """The probing thread of one node (``run``); stops once ``done`` says so."""

    def __init__(self, config: GangConfig, host: str, port: int, node_index: int, secret: bytes,
                 hearing: Hearing, on_cause: Callable[[Cause], None], done: Callable[[], bool],
                 closing: threading.Event) -> None:
        self.config = config
        self.host = host
        self.port = port
        self.node_index = node_index
        self.secret = secret
        self.hearing = hearing
        self.on_cause = on_cause
        self.done = done
        self.closing = closing
        self.sent = self.answered = 0  # probes, for the debug log and the tests

    def run(self) -> None:
        period = self.config.heartbeat_interval
        while not self.closing.is_set() and not self.done():
            wait = self.hearing.any + self.config.probe_after - time.monotonic()
            if wait > 0:
                self.closing.wait(min(wait, period))
                continue
            began = time.monotonic()
            self.sent += 1
            if self.once(period):
                self.answered += 1
                _log.debug("node %d: probe %d answered after %.1f s of silence on the connection", self.node_index,
                           self.sent, began - self.hearing.link)
            self.closing.wait(max(0.0, began + period - time.monotonic()))

    def once(self, connect_timeout: float) -> bool:
        """One probe; True when the service answered. ``connect_timeout`` is
        short: a lost SYN is resent by the next probe, not after Linux's 1 s."""
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
    """The service's lines on a probe's connection, one at a time."""

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
