"""How a node joins the gang: find the control's service among the candidate
ports, prove the gang's secret and make the service prove it too; once, on
the join's thread, before the client starts its other threads."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Callable, NamedTuple, Optional, Sequence

from ..cause import Cause
from ..host.network import host_name
from ..base import timeouts
from . import auth as gang_auth
from . import wire
from .config import GangConfig


class Link(NamedTuple):
    sock: socket.socket
    port: int
    early: bytes  # what the service sent after its welcome, for the reader
    cause: Optional[Cause]  # the gang's verdict, when it was over before this node joined


class Joiner:
    def __init__(self, config: GangConfig, host: str, ports: Sequence[int], node_index: int, secret: bytes,
                 closing: threading.Event, progress: Callable[[str], None]) -> None:
        self.config = config
        self.host = host
        self.ports = tuple(ports)
        self.node_index = node_index
        self._secret = secret
        self._closing = closing
        self.progress = progress
        self.last_error: Optional[BaseException] = None
        self._early = b""

    def join(self, patience: float) -> Optional[Link]:
        """None when no port held our gang's service within ``patience``. Says what it tries as it goes:
        a worker cut off learns it here, not once ``start_timeout`` has passed."""
        started = time.monotonic()
        deadline = started + patience
        next_word = started + self.config.progress_interval
        while not self._closing.is_set():
            for port in self.ports:
                left = deadline - time.monotonic()
                if left <= 0 or self._closing.is_set():
                    return None
                try:
                    return self._handshake(port, min(timeouts.CONNECT_TIMEOUT, left))
                except (OSError, ValueError, RuntimeError) as e:
                    self.last_error = e
                now = time.monotonic()
                if now >= next_word:
                    next_word = now + self.config.progress_interval
                    self.progress("still trying to reach the control node's gang service at %s: %.0f s of %g s "
                                  "(last error: %s)" % (self.where(), now - started, patience,
                                                        error_text(self.last_error)))
            self._closing.wait(min(0.2, max(0.0, deadline - time.monotonic())))
        return None

    def where(self) -> str:
        return "%s port %s" % (self.host, " or ".join(map(str, self.ports)))

    def _handshake(self, port: int, connect_timeout: float = timeouts.CONNECT_TIMEOUT) -> Link:
        """A port held by anything but our gang (another gang, a server, an impostor) fails here."""
        sock = socket.create_connection((self.host, port), timeout=connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(connect_timeout)
            self._early = b""
            server_nonce = gang_auth.read_challenge(self._read_one(sock))
            client_nonce = gang_auth.new_nonce()
            wire.send(sock, gang_auth.hello(self._secret, self.config.gang_id, server_nonce, self.node_index,
                                            host=host_name(self.node_index), pid=os.getpid(),
                                            client_nonce=client_nonce).to_wire())
            # Once a service has our hello it may count this node in: giving up
            # now would read as a node that died (a busy control answers late),
            # so its answer is waited for as long as any silence is.
            sock.settimeout(max(2.0, self.config.heartbeat_timeout))
            welcome = gang_auth.check_welcome(self._secret, self.config.gang_id, server_nonce, client_nonce,
                                              self.node_index, self._read_one(sock))
        except BaseException:
            wire.close_quietly(sock)
            raise
        sock.settimeout(None)
        return Link(sock, port, self._early, welcome.cause)

    def _read_one(self, sock: socket.socket) -> wire.Message:
        """What came after the line is kept for the reader."""
        data = self._early
        while b"\n" not in data:
            if len(data) > wire.PRE_AUTH_LINE:
                raise ValueError("not a gang service (a greeting that does not end)")
            chunk = sock.recv(4096)
            if not chunk:
                raise ValueError("connection closed during the handshake")
            data += chunk
        line, self._early = data.split(b"\n", 1)
        message = wire.decode(line)
        if message is None:
            raise ValueError("not a gang service")
        return message


def error_text(error: Optional[BaseException]) -> str:
    if error is None:
        return "none"
    if isinstance(error, socket.timeout):
        return "connection timed out"
    return str(error) or type(error).__name__
