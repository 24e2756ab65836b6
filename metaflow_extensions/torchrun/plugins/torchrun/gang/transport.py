"""The gang service's sockets: one selector, the listener, every connection.
Mechanics only: ``on_drop`` says what a dropped connection means for the gang."""

from __future__ import annotations

import resource
import selectors
import socket
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .admission import MAX_PENDING, Admission
from .peer import Peer
from .wire import close_quietly
from ..base import timeouts


Event = Tuple[Optional[Peer], int]  # (None, 0): woken to close


class Transport:
    def __init__(self, host: str, ports: Sequence[int], num_nodes: int, admission: Admission,
                 on_drop: Callable[[Peer], None]) -> None:
        self.admission = admission
        self.on_drop = on_drop
        _raise_fd_limit(num_nodes + MAX_PENDING + 256)
        # A deep backlog: newcomers wait there while the pending places are full.
        self.listener = _listen(host, ports, backlog=max(MAX_PENDING, 2 * num_nodes))
        self.port: int = self.listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.listener, selectors.EVENT_READ)
        self._accepting = True
        self._paused_until = 0.0
        # close() wakes the loop through this pair: the control's step ends up to half a second sooner.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self.peers: Dict[socket.socket, Peer] = {}

    def wait(self, timeout: float) -> List[Event]:
        """New connections are accepted here; the peers that can be read or written are returned."""
        out: List[Event] = []
        for key, mask in self._selector.select(timeout=timeout):
            if key.fileobj is self.listener:
                self._accept()
            elif key.fileobj is self._wake_r:
                return [(None, 0)]
            else:
                out.append((key.data, mask))
        return out

    def ready(self, peer: Peer, mask: int) -> Optional[List[dict]]:
        """Write, then read: its complete lines, or None when it is gone."""
        if mask & selectors.EVENT_WRITE:
            self.flush(peer)
        if not mask & selectors.EVENT_READ or peer.sock not in self.peers:
            return []
        lines = peer.read()
        if lines is None:
            self.drop(peer)
        return lines

    def wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def close(self) -> None:
        for peer in list(self.peers.values()):
            close_quietly(peer.sock)
        for sock in (self.listener, self._wake_r, self._wake_w):
            close_quietly(sock)
        self._selector.close()

    def send(self, peer: Peer, data: bytes) -> None:
        peer.queue(data)
        self.flush(peer)

    def flush(self, peer: Peer) -> None:
        if peer.sock not in self.peers:
            return
        if not peer.flush():
            self.drop(peer)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if peer.outbox else 0)
        try:
            if self._selector.get_key(peer.sock).events != events:
                self._selector.modify(peer.sock, events, peer)
        except (KeyError, ValueError):
            pass

    def drop(self, peer: Peer) -> None:
        if peer.sock not in self.peers:
            return
        try:
            self._selector.unregister(peer.sock)
        except (KeyError, ValueError):
            pass
        del self.peers[peer.sock]
        self.admission.forget(peer)
        close_quietly(peer.sock)
        self.resume(time.monotonic())
        self.on_drop(peer)

    def resume(self, now: float) -> None:
        if not self._accepting and now >= self._paused_until:
            self._selector.register(self.listener, selectors.EVENT_READ)
            self._accepting = True

    def _accept(self) -> None:
        if self.admission.full:
            oldest = self.admission.oldest()
            if oldest is not None and time.monotonic() - oldest.connected < timeouts.EVICT_AGE:
                self._pause(oldest.connected + timeouts.EVICT_AGE)
                return
            if oldest is not None:
                self.drop(oldest)
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            # Out of file descriptors (EMFILE) leaves the connection queued and
            # the listener readable: pause instead of spinning on it.
            self._pause(time.monotonic() + timeouts.ACCEPT_BACKOFF)
            return
        peer = self.admission.admit(sock)
        self.peers[sock] = peer
        self._selector.register(sock, selectors.EVENT_READ, peer)
        self.flush(peer)

    def _pause(self, until: float) -> None:
        if self._accepting:
            self._selector.unregister(self.listener)
            self._accepting = False
        self._paused_until = until


def _raise_fd_limit(wanted: int) -> None:
    """A 1,024-node gang passes the common soft limit of 1,024 open files."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            limit = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    except (ValueError, OSError):
        pass


def _listen(host: str, ports: Sequence[int], backlog: int) -> socket.socket:
    errors = []
    for port in ports:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(backlog)
        except OSError as e:
            close_quietly(sock)
            errors.append("%d: %s" % (port, e.strerror or e))
            continue
        sock.setblocking(False)
        return sock
    raise OSError("no port free for the gang service on %s (%s)" % (host or "*", "; ".join(errors)))
