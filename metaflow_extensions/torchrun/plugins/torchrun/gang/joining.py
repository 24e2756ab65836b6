"""How a node joins the gang: find the control's service among the candidate
ports, prove the gang's secret and make the service prove it too, then start
the reader, heartbeat and probe (``probing.py``) threads and send this node's
preflight. A mixin of ``GangClient`` (``client.py``), which holds the state;
kept apart because joining is the one part of a node's side that runs before
the gang exists."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Callable, List, Optional, Sequence

from ..cause import Cause, CauseKind
from ..host import log
from ..host import host_name
from .. import timeouts
from . import auth as gang_auth
from . import messages as msg
from . import wire
from .config import GangConfig
from .probing import Hearing, Prober

_log = log.get("gang.client")


class Joining:
    # A node's side of the gang, as GangClient.__init__ sets it.
    config: GangConfig
    host: str
    ports: Sequence[int]
    port: Optional[int]
    node_index: int
    joined: threading.Event
    all_left: threading.Event
    cause: Optional[Cause]
    hearing: Hearing
    progress: Callable[[str], None]
    preflight: Optional[Callable[[], msg.Preflight]]
    _get_secret: Optional[Callable[[], bytes]]
    _secret: bytes
    _sock: Optional[socket.socket]
    _early: bytes
    _closing: threading.Event
    _preflight_sent: threading.Event
    _threads: List[threading.Thread]

    def _set_cause(self, cause: Cause) -> None:
        raise NotImplementedError

    def _safe_send(self, message: msg.GangMessage) -> None:
        raise NotImplementedError

    def _read_loop(self) -> None:
        raise NotImplementedError

    def _beat_loop(self) -> None:
        raise NotImplementedError

    def connect(self, give_up_after: Optional[float] = None) -> None:
        """Connect and say hello, retrying while the control is not up yet: nodes
        start in any order (on Kubernetes workers often start first)."""
        patience = give_up_after if give_up_after is not None else self.config.start_timeout
        began = time.monotonic()
        if not self._have_secret():
            self.joined.set()
            return
        last_error = self._try_ports(patience)
        if self._sock is None:
            if not self._closing.is_set():
                self._set_cause(
                    Cause(
                        CauseKind.CONTROL_UNREACHABLE,
                        "could not reach the control node's gang service at %s within %gs (last error: %s)"
                        % (self._where(), patience, error_text(last_error)),
                    )
                )
            self.joined.set()
            return
        _log.debug("node %d: joined the gang at %s port %s in %.3fs", self.node_index, self.host, self.port,
                   time.monotonic() - began)
        assert self.port is not None
        self.hearing = Hearing()  # when this node last heard the control, read by the reader and the prober
        prober = Prober(self.config, self.host, self.port, self.node_index, self._secret, self.hearing,
                        self._set_cause, lambda: self.cause is not None or self.all_left.is_set(), self._closing)
        for target, name in ((self._read_loop, "reader"), (self._beat_loop, "heartbeat"), (prober.run, "probe")):
            t = threading.Thread(target=target, name="torchrun-gang-" + name, daemon=True)
            t.start()
            self._threads.append(t)
        self.joined.set()
        self._send_preflight()

    def _try_ports(self, patience: float) -> Optional[BaseException]:
        """Each candidate port in turn until one holds our gang's service, for
        ``patience`` seconds at most (no attempt outlives it); the last error.
        Every ``progress_interval`` it says what it is trying, and what went
        wrong last (a worker cut off from the control learns it here, not once
        ``start_timeout`` has passed)."""
        started = time.monotonic()
        deadline = started + patience
        next_word = started + self.config.progress_interval
        last_error: Optional[BaseException] = None
        while not self._closing.is_set():
            for port in self.ports:
                left = deadline - time.monotonic()
                if left <= 0 or self._closing.is_set():
                    return last_error
                try:
                    self._handshake(port, min(timeouts.CONNECT_TIMEOUT, left))
                    return None
                except (OSError, ValueError, RuntimeError) as e:
                    last_error = e
                now = time.monotonic()
                if now >= next_word:
                    next_word = now + self.config.progress_interval
                    self.progress("still trying to reach the control node's gang service at %s: %.0f s of %g s "
                                  "(last error: %s)" % (self._where(), now - started, patience,
                                                        error_text(last_error)))
            self._closing.wait(min(0.2, max(0.0, deadline - time.monotonic())))
        return last_error

    def _where(self) -> str:
        return "%s port %s" % (self.host, " or ".join(map(str, self.ports)))

    def _send_preflight(self) -> None:
        """After ``joined``: the step's code does not wait for it; a call
        does (``enter_call``), so the service has it before this node's call."""
        try:
            if self.preflight is not None:
                self._safe_send(self.preflight())
        except Exception as e:  # a check of our own must not cost the step
            self._safe_send(msg.Preflight(checks=(msg.PreflightCheck(
                "preflight", "warn", "could not measure: %s: %s" % (type(e).__name__, e)),)))
        finally:
            self._preflight_sent.set()

    def _have_secret(self) -> bool:
        if self._get_secret is None:
            return True
        try:
            self._secret = gang_auth.check_secret(self._get_secret())
        except Exception as e:
            self._set_cause(Cause(CauseKind.CONTROL_UNREACHABLE,
                                  "could not get the gang's secret: %s: %s" % (type(e).__name__, e)))
            return False
        self._get_secret = None
        return True

    def _handshake(self, port: int, connect_timeout: float = timeouts.CONNECT_TIMEOUT) -> None:
        """Prove this node holds the secret on ``port``, and have the service
        prove it too; a port held by anything but our gang (another gang's
        service, an unrelated server, an impostor) fails here and the next is
        tried."""
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
        self._sock = sock
        self.port = port
        if welcome.cause is not None:
            self._set_cause(welcome.cause)

    def _read_one(self, sock: socket.socket) -> wire.Message:
        """One line of the handshake (what came after it is kept for the
        reader): ValueError when it is not a JSON object, or too long."""
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
    """An error as a user reads it: ``[Errno 113] No route to host``."""
    if error is None:
        return "none"
    if isinstance(error, socket.timeout):
        return "connection timed out"
    return str(error) or type(error).__name__
