"""Who may join: connections that have not proved the gang's secret yet.

A stranger gets a tiny line limit, ``HELLO_TIMEOUT`` to prove itself and one
of ``MAX_PENDING`` places; a newcomer takes the oldest stranger's place only
once that one had ``EVICT_AGE`` to answer (the kernel's backlog holds the
newcomers meanwhile). So a join storm never evicts a node handshaking
properly, and a flood of idle connections costs at most ``MAX_PENDING`` sockets.
"""

from __future__ import annotations

import socket
from typing import Callable, Dict, List, Optional, Tuple

from . import auth
from . import messages as msg
from .config import GangConfig
from .peer import Peer, address
from ..cause import Cause
from .wire import encode
from ..base import timeouts

# Connections not proved yet, at most (a 1,024-node gang may all knock at once).
MAX_PENDING = 1024


class Admission:
    def __init__(self, config: GangConfig, secret: bytes, warn: Callable[[str], None]) -> None:
        self.config = config
        self._secret = auth.check_secret(secret)
        self.warn = warn
        self.pending: Dict[socket.socket, Peer] = {}
        self.rejected = 0  # strangers that failed the handshake

    @property
    def full(self) -> bool:
        return len(self.pending) >= MAX_PENDING

    def admit(self, sock: socket.socket) -> Peer:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = Peer(sock)
        self.pending[sock] = peer
        peer.queue(_line(auth.challenge(peer.nonce)))
        return peer

    def oldest(self) -> Optional[Peer]:
        return next(iter(self.pending.values()), None)

    def forget(self, peer: Peer) -> None:
        self.pending.pop(peer.sock, None)

    def hello(self, peer: Peer, data: msg.WireDict) -> Optional[Tuple[int, bytes, str]]:
        """Its node index, nonce and host name; None (and a reject queued) when it proves nothing."""
        try:
            node, client_nonce = auth.check_hello(self._secret, self.config.gang_id, peer.nonce, data,
                                                  self.config.num_nodes)
        except auth.AuthError as e:
            self._refuse(peer, e)
            return None
        host = data.get("host")
        return node, client_nonce, host[:255] if isinstance(host, str) and host else "?"

    def probe(self, peer: Peer, data: msg.WireDict) -> Optional[Tuple[int, bytes]]:
        try:
            return auth.check_probe(self._secret, self.config.gang_id, peer.nonce, data, self.config.num_nodes)
        except auth.AuthError as e:
            self._refuse(peer, e)
            return None

    def _refuse(self, peer: Peer, error: auth.AuthError) -> None:
        self.rejected += 1
        if self.rejected == 1:
            self.warn(
                "a connection to the gang service from %s did not prove it holds the gang's secret "
                "(%s): turned away (said once; another gang's node, or someone probing the port)"
                % (address(peer.sock), error))
        peer.queue(_line(msg.Reject("not authenticated")))

    def welcome(self, peer: Peer, node: int, client_nonce: bytes, cause: Optional[Cause]) -> None:
        peer.queue(_line(auth.welcome(self._secret, self.config.gang_id, peer.nonce, client_nonce, node,
                                      cause=cause)))

    def expired(self, now: float) -> List[Peer]:
        return [p for p in self.pending.values() if now - p.connected > timeouts.HELLO_TIMEOUT]

    def check_payload(self, node: int, done: msg.CallDone) -> bool:
        return done.rank0 is not None and auth.check_payload(
            self._secret, self.config.gang_id, done.index, node, done.rank0, done.rank0_proof)


def _line(message: msg.GangMessage) -> bytes:
    return encode(message.to_wire())
