"""A member's probe on a fresh connection (gang/probing.py): the pure proof, the
service's answer over real sockets (hearing the node, the welcome, the close),
hostile probes refused like any stranger, and a node whose connection stalls
while fresh ones get through riding the silence out, then, past link_timeout,
stopping with a cause that says so."""

from __future__ import annotations

import socket
import threading
import time

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from gang_net import GUARD, HOST, SECRET, closed_by_peer, new_config, read_line
from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.gang import auth
from metaflow_extensions.torchrun.plugins.torchrun.gang import messages
from metaflow_extensions.torchrun.plugins.torchrun.gang import wire
from metaflow_extensions.torchrun.plugins.torchrun.gang.client import GangClient
from metaflow_extensions.torchrun.plugins.torchrun.gang.probing import Hearing, Prober
from proc_helpers import wait_until

GANG = "flow-1-train-2-0"
OTHER = b"o" * 32


def a_probe(node=1, secret=SECRET, gang=GANG, server_nonce=b"n" * 32, client_nonce=b"c" * 32):
    return auth.probe(secret, gang, server_nonce, node, client_nonce).to_wire()


class TestProofs:
    def test_a_probe_that_proves_the_secret_is_accepted(self):
        assert auth.check_probe(SECRET, GANG, b"n" * 32, a_probe(), num_nodes=2) == (1, b"c" * 32)

    @pytest.mark.parametrize("change", [
        dict(secret=OTHER), dict(gang="flow-1-train-2-1"), dict(server_nonce=b"m" * 32),
    ])
    def test_a_probe_for_another_secret_gang_or_connection_fails(self, change):
        with pytest.raises(auth.AuthError):
            auth.check_probe(SECRET, GANG, b"n" * 32, a_probe(**change), num_nodes=2)

    @pytest.mark.parametrize("field, value", [
        ("node_index", 0), ("node_index", -1), ("node_index", True), ("node_index", "1"), ("node_index", 1 << 20),
        ("nonce", "d" * 64), ("nonce", None), ("nonce", "00"), ("proof", "0" * 64), ("proof", None), ("proof", 3),
        ("proof", "a" * 65), ("protocol", messages.PROTOCOL - 1), ("protocol", None), ("type", "hello"),
    ])
    def test_a_tampered_probe_fails(self, field, value):
        message = a_probe()
        message[field] = value
        with pytest.raises(auth.AuthError):
            auth.check_probe(SECRET, GANG, b"n" * 32, message, num_nodes=2)

    def test_a_probe_never_passes_for_a_hello_nor_a_hello_for_a_probe(self):
        hello = auth.hello(SECRET, GANG, b"n" * 32, 1, client_nonce=b"c" * 32).to_wire()
        as_probe = dict(a_probe(), proof=hello["proof"])
        with pytest.raises(auth.AuthError, match="wrong proof"):
            auth.check_probe(SECRET, GANG, b"n" * 32, as_probe, num_nodes=2)
        as_hello = dict(hello, proof=a_probe()["proof"])
        with pytest.raises(auth.AuthError, match="wrong proof"):
            auth.check_hello(SECRET, GANG, b"n" * 32, as_hello, num_nodes=2)

    def test_the_node_index_is_checked_after_the_proof(self):
        with pytest.raises(auth.AuthError, match="out of range"):
            auth.check_probe(SECRET, GANG, b"n" * 32, a_probe(node=5), num_nodes=2)
        with pytest.raises(auth.AuthError, match="wrong proof"):
            auth.check_probe(SECRET, GANG, b"n" * 32, a_probe(node=5, secret=OTHER), num_nodes=2)


def probe_raw(server, node, secret=SECRET, **override):
    """A probe played by hand: the service's answer, and its socket."""
    sock = socket.create_connection((HOST, server.port), timeout=GUARD)
    challenge = read_line(sock)
    message = auth.probe(secret, server.config.gang_id, bytes.fromhex(challenge["nonce"]), node,
                         auth.new_nonce()).to_wire()
    message.update(override)
    sock.sendall(wire.encode(message))
    return read_line(sock), sock


class TestTheService:
    def test_a_members_probe_is_hearing_it_answered_with_a_welcome_then_closed(self, net):
        server = net.server(2)
        c0, c1 = net.join(server, [0, 1])
        peer = server.handlers.members.by_node[1]
        peer.last_seen -= 100  # as if its connection had been silent
        before = peer.last_seen
        answer, sock = probe_raw(server, 1)
        try:
            assert answer["type"] == "welcome" and "cause" not in answer
            assert closed_by_peer(sock)
        finally:
            wire.close_quietly(sock)
        assert peer.last_seen > before + 99
        assert server.cause is None and server.handlers.members.by_node[1] is peer and server.admission.rejected == 0

    def test_a_probe_of_a_node_not_in_the_gang_is_refused(self, net):
        server = net.server(3)
        net.join(server, [0, 1])
        answer, sock = probe_raw(server, 2)
        wire.close_quietly(sock)
        assert answer == {"type": "reject", "reason": "node 2 is not in the gang"}
        assert server.missing() == [2] and server.cause is None

    def test_once_the_gang_is_over_a_probe_hears_why(self, net):
        server = net.server(2)
        c0, c1 = net.join(server, [0, 1])
        c0.report_failure(Cause(CauseKind.STEP_FAILED, "node 0 raised"))
        assert wait_until(lambda: server.cause is not None, GUARD)
        answer, sock = probe_raw(server, 1)
        wire.close_quietly(sock)
        assert answer["type"] == "welcome" and answer["cause"]["summary"] == "node 0 raised"

    @pytest.mark.parametrize("secret, override", [
        (OTHER, {}), (SECRET, {"proof": "0" * 64}), (SECRET, {"node_index": "1"}), (SECRET, {"nonce": "zz"}),
        (SECRET, {"protocol": 4}), (SECRET, {"node_index": 1 << 30}),
    ])
    def test_a_hostile_probe_is_turned_away_and_changes_nothing(self, net, secret, override):
        said = []
        server = net.server(2, hooks={"warn": said.append})
        net.join(server, [0, 1])
        peer = server.handlers.members.by_node[1]
        peer.last_seen -= 100
        before = peer.last_seen
        answer, sock = probe_raw(server, 1, secret=secret, **override)
        wire.close_quietly(sock)
        assert answer == {"type": "reject", "reason": "not authenticated"}
        assert peer.last_seen == before and server.cause is None and server.admission.rejected == 1
        assert len(said) == 1 and "did not prove" in said[0]

    def test_a_probe_on_a_members_own_connection_is_out_of_turn(self, net):
        """Only a stranger's first line may be a probe: a member that sends one
        breaks the protocol, as with any message out of turn."""
        server = net.server(2)
        c0, c1 = net.join(server, [0, 1])
        c1._safe_send(messages.Probe(node_index=1, nonce=b"c" * 32, proof="0" * 64))
        assert wait_until(lambda: server.cause is not None, GUARD)
        assert server.cause.kind is CauseKind.NODE_LOST and server.cause.node_index == 1


class TestHearing:
    def test_what_ends_a_node_is_silence_by_every_means_or_a_dead_connection(self):
        config = new_config(2, heartbeat_timeout=8)
        hearing = Hearing()
        now = hearing.link
        assert hearing.verdict(config, now + 7.9) is None
        silent = hearing.verdict(config, now + 8.5)
        assert silent.kind is CauseKind.CONTROL_UNRESPONSIVE and silent.node_index == 0
        assert silent.summary.startswith("heard nothing from the control node (node 0) for 8s (heartbeat_timeout=8s)")
        hearing.any = now + 20  # probes answered; the connection silent since ``now``
        assert hearing.verdict(config, now + 23.9) is None  # link_timeout = 3 x 8 s
        dead = hearing.verdict(config, now + 24.5)
        assert dead.summary.startswith("the connection to the control node (node 0) carried nothing for 24s")

    def test_a_probe_never_moves_the_connections_clock(self):
        hearing = Hearing()
        hearing.link = hearing.any = 0.0
        hearing.on_probe()
        assert hearing.link == 0.0 and hearing.any > 0.0
        hearing.on_link()
        assert hearing.any >= hearing.link > 0.0


class TestTheProber:
    def test_an_answered_probe_is_hearing_on_both_sides(self, net):
        server = net.server(2)
        c0, c1 = net.join(server, [0, 1])
        hearing = Hearing()
        hearing.any = hearing.link = time.monotonic() - 100
        peer = server.handlers.members.by_node[1]
        peer.last_seen -= 100
        prober = Prober(server.config, HOST, server.port, 1, SECRET, hearing, c1._set_cause, lambda: False,
                        threading.Event())
        assert prober.once(GUARD)
        assert time.monotonic() - hearing.any < GUARD and time.monotonic() - hearing.link > 99
        assert time.monotonic() - peer.last_seen < GUARD

    def test_a_service_without_the_secret_is_not_heard(self, net):
        server = net.server(2, secret=OTHER)
        hearing = Hearing()
        hearing.any = time.monotonic() - 100
        prober = Prober(server.config, HOST, server.port, 1, SECRET, hearing, lambda cause: None, lambda: False,
                        threading.Event())
        assert not prober.once(GUARD)
        assert time.monotonic() - hearing.any > 99

    def test_nothing_listening_is_no_answer(self, net):
        config = new_config(2)
        listener = net.listener()
        port = listener.getsockname()[1]
        listener.close()
        prober = Prober(config, HOST, port, 1, SECRET, Hearing(), lambda cause: None, lambda: False,
                        threading.Event())
        assert not prober.once(0.5)


class StallingProxy:
    """Forwards connections to the service; ``stall()`` stops forwarding on the
    connections open now (their bytes are held, as a link whose resends back
    off would), while new connections are forwarded."""

    def __init__(self, net, port: int) -> None:
        self.port_to = port
        self.listener = net.listener()
        self.port = self.listener.getsockname()[1]
        self.stalled: set = set()
        self.conns: list = []
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.listener.settimeout(0.1)
        while not self.stop.is_set():
            try:
                a, _ = self.listener.accept()
            except OSError:
                continue
            b = socket.create_connection((HOST, self.port_to))
            self.conns += [a, b]
            pair = len(self.conns)
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(src, dst, pair), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, pair: int) -> None:
        while not self.stop.is_set():
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                wire.close_quietly(dst)
                return
            while pair in self.stalled and not self.stop.is_set():
                time.sleep(0.05)
            try:
                dst.sendall(data)
            except OSError:
                return

    def stall(self) -> None:
        self.stalled.update(range(len(self.conns) + 1))

    def close(self) -> None:
        self.stop.set()
        for s in self.conns:
            wire.close_quietly(s)


@pytest.fixture
def proxy_net(net):
    proxies = []

    def make(port):
        proxies.append(StallingProxy(net, port))
        return proxies[-1]

    yield make
    for p in proxies:
        p.close()


def test_a_stalled_connection_is_ridden_out_on_fresh_ones_then_named_dead(net, proxy_net):
    """heartbeat_timeout=3 (probes after 0.6 s, every 0.3 s; link_timeout 9 s).
    The node's connection carries nothing from the moment it stalls: through
    probes neither side counts the silence past heartbeat_timeout; past
    link_timeout the node stops, saying the connection is dead, not that the
    control is silent. Without probes, both ended after heartbeat_timeout."""
    server = net.server(2, heartbeat_timeout=3.0)
    (c0,) = net.join(server, [0])
    proxy = proxy_net(server.port)
    c1 = GangClient(server.config, HOST, [proxy.port], 1, secret=SECRET)
    net.clients.append(c1)
    c1.connect(give_up_after=GUARD)
    assert c1.cause is None and wait_until(lambda: 1 in server.handlers.members.joined_at, GUARD)
    stalled = time.monotonic()
    proxy.stall()
    assert not wait_until(lambda: c1.cause is not None or server.cause is not None, 6.0)  # 2 x heartbeat_timeout
    assert wait_until(lambda: c1.cause is not None, 3.0 + GUARD)
    assert time.monotonic() - stalled >= server.config.link_timeout
    assert c1.cause.kind is CauseKind.CONTROL_UNRESPONSIVE
    assert "connection to the control node (node 0) carried nothing" in c1.cause.summary
    assert "still answered on fresh connections" in c1.cause.summary
