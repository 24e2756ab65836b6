"""Hostile clients against a real running gang service (issue 13).

Each test lets an attacker who can reach the control's port, but does not
hold the gang's secret, do one thing from the issue: garbage, deep and huge
lines, a thousand connections, slow-loris clients, a fake failure, a fake
done, a pickle payload, a hello for a node that is taken, the wrong secret,
running the service out of file descriptors. Then a real two-node gang goes
through a whole step (join, a call with rank 0's return value on node 1, done,
leave) on the same service, and must end exactly as it would have without
the attacker: no cause, rank 0's real bytes at the control, nothing executed,
the service's thread alive and its CPU idle.

The same is checked for a peer that does hold the secret but breaks the rules
(a member's bad fields, a forged rank 0 MAC): it is dropped, and what it sent
is never kept.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import time

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from gang_net import GUARD, HOST, SECRET, Net, RawPeer, closed_by_peer, wait_cause, node_report
from metaflow_extensions.torchrun.plugins.torchrun.base import timeouts
from metaflow_extensions.torchrun.plugins.torchrun.gang import auth as gang_auth
from metaflow_extensions.torchrun.plugins.torchrun.gang import admission as gang_admission
from metaflow_extensions.torchrun.plugins.torchrun.gang import wire
from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.gang.config import GangConfig
from metaflow_extensions.torchrun.plugins.torchrun.gang.client import GangClient

WRONG = b"w" * 32
LEGIT_RANK0 = pickle.dumps({"loss": 0.25})


class Boom:
    """Unpickling this creates a file: proof that something ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture
def fast_hello(monkeypatch):
    monkeypatch.setattr(timeouts, "HELLO_TIMEOUT", 0.5)


def legit_step(net: Net, server) -> None:
    """A whole step of a real two-node gang, and what the control then holds."""
    a, b = net.join(server, [0, 1])
    ports = {}
    t = threading.Thread(target=lambda: ports.setdefault(0, a.enter_call(0, "train.py")), daemon=True)
    t.start()
    ports[1] = b.enter_call(0, "train.py")
    t.join(GUARD)
    assert ports[0] == ports[1] is not None, (a.cause, b.cause)
    b.call_done(0, LEGIT_RANK0, node_report(1))  # rank 0 ran on node 1
    a.call_done(0, None, node_report(0))
    assert a.wait_call_done(0), a.cause
    call = server.handlers.book.calls[0]
    assert (call.rank0, call.rank0_node) == (LEGIT_RANK0, 1)
    assert pickle.loads(call.rank0) == {"loss": 0.25}  # what call.py then does
    b.leave(1, ok=True)
    a.leave(1, ok=True)
    assert a.wait_all_left(), a.cause
    assert server.cause is None and a.cause is None and b.cause is None
    assert server._thread.is_alive()


def assert_idle(server, seconds: float = 1.0) -> None:
    """The service is not spinning: this process (whose only busy thread would
    be the service's) uses little CPU while nothing happens."""
    t0, c0 = time.monotonic(), time.process_time()
    time.sleep(seconds)
    used = time.process_time() - c0
    assert used < 0.25 * (time.monotonic() - t0), "%.2fs of CPU in %.1fs" % (used, seconds)
    assert server._thread.is_alive()


def send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass  # the service hung up first: fine


class TestStrangers:
    @pytest.mark.parametrize("payload", [
        b"[" * 100_000 + b"\n",
        b"{" * 100_000,
        b"\x00\xff" * 5000 + b"\n",
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        json.dumps({"type": "hello", "node_index": 1e400}).replace("1e+400", "1e400").encode() + b"\n",
        b'{"type": "hello", "node_index": 1e400, "protocol": 3, "nonce": "' + b"00" * 32 + b'", "proof": "x"}\n',
        b'{"type": "hello", "node_index": 1' + b"0" * 5000 + b"}\n",
        b'{"type": "failed", "cause": "a string, not a cause"}\n',
        b'{"type": "call_done", "index": 0, "rank0": "!!!not base64"}\n',
        b'{"type": "leave", "calls": 0, "ok": true}\n',
        b'{"type": "hb"}\n' * 1000,
        b"\n" * 10_000,
    ])
    def test_a_line_from_a_stranger_changes_nothing(self, net, payload):
        server = net.server(2)
        s = net.raw(server.port)
        send_quietly(s.sock, payload)
        assert closed_by_peer(s.sock)
        assert server._thread.is_alive() and server.cause is None and server.missing() == [0, 1]
        legit_step(net, server)

    def test_a_huge_line_is_cut_off_after_a_few_kilobytes(self, net):
        server = net.server(2)
        s = net.raw(server.port)
        sent = 0
        s.sock.settimeout(GUARD)
        try:
            for _ in range(10 * 1024):  # up to 10 MB, no newline
                s.sock.sendall(b"x" * 1024)
                sent += 1024
        except OSError:
            pass
        assert closed_by_peer(s.sock)
        assert sent < 10 * 1024 * 1024, "the service read 10 MB of one line"
        legit_step(net, server)

    def test_the_wrong_secret(self, net):
        server = net.server(2)
        for node in (0, 1):
            assert net.raw(server.port).hello(server.config, node, secret=WRONG) == {
                "type": "reject", "reason": "not authenticated"}
        assert server.missing() == [0, 1] and server.admission.rejected == 2
        legit_step(net, server)

    def test_a_hello_for_a_taken_node_does_not_evict_it(self, net):
        server = net.server(2)
        a, b = net.join(server, [0, 1])
        for secret in (WRONG, SECRET):  # without the secret, and even with it
            assert net.raw(server.port).hello(server.config, 1, secret=secret)["type"] == "reject"
        time.sleep(0.2)
        assert server.handlers.members.by_node[1].sock.fileno() != -1 and b.cause is None and server.cause is None
        b.close()  # the real node 1 is still the one watched
        (cause,) = wait_cause([a])
        assert (cause.kind, cause.node_index) == (CauseKind.NODE_LOST, 1)

    def test_a_fake_failure_stops_nothing_and_is_stored_nowhere(self, net):
        server = net.server(2)
        fake = Cause(CauseKind.RANK_FAILED, "FAKE ROOT CAUSE", node_index=1).to_wire()
        s = net.raw(server.port)
        s.hello(server.config, 1, secret=WRONG)
        send_quietly(s.sock, wire.encode({"type": "failed", "cause": fake}))
        s2 = net.raw(server.port)  # and without any hello at all
        s2.read_challenge()
        send_quietly(s2.sock, wire.encode({"type": "failed", "cause": fake}))
        time.sleep(0.7)  # beyond the 0.5 s the issue saw the job stop in
        assert server.cause is None
        legit_step(net, server)

    def test_a_fake_done_and_leave_before_node_1_joins_leave_its_liveness_on(self, net):
        server = net.server(2)
        s = net.raw(server.port)
        s.hello(server.config, 1, secret=WRONG)
        for message in ({"type": "call_done", "index": 0}, {"type": "leave", "calls": 0, "ok": True}):
            send_quietly(s.sock, wire.encode(message))
        a, b = net.join(server, [0, 1])
        assert server.handlers.members.left == {} and server.handlers.book.calls == {}
        b.close()  # node 1's task dies: still noticed at once
        (cause,) = wait_cause([a])
        assert (cause.kind, cause.node_index) == (CauseKind.NODE_LOST, 1)

    def test_a_pickle_payload_is_never_loaded_nor_kept(self, net, tmp_path):
        marker = tmp_path / "executed"
        payload = base64.b64encode(pickle.dumps(Boom(str(marker)))).decode()
        server = net.server(2)
        s = net.raw(server.port)
        s.hello(server.config, 1, secret=WRONG)
        send_quietly(s.sock, wire.encode({"type": "call_done", "index": 0, "rank0": payload, "report": {}}))
        legit_step(net, server)
        assert server.handlers.book.calls[0].rank0 == LEGIT_RANK0
        assert not marker.exists()

    def test_a_thousand_connections(self, net):
        server = net.server(2)
        flood = []
        try:
            for _ in range(1000):
                c = socket.socket()
                c.setblocking(False)
                c.connect_ex((HOST, server.port))
                flood.append(c)
            time.sleep(0.5)
            assert server._thread.is_alive()
            pending = len(server.admission.pending)
            assert pending <= gang_admission.MAX_PENDING
            t0 = time.monotonic()
            legit_step(net, server)  # joins while the flood is still connected
            assert time.monotonic() - t0 < GUARD
        finally:
            for c in flood:
                c.close()
        assert_idle(server)

    def test_slow_loris_clients_are_dropped_and_let_nodes_in(self, net, fast_hello):
        server = net.server(2)
        loris = []
        for _ in range(gang_admission.MAX_PENDING + 10):
            r = RawPeer(server.port)
            net.raws.append(r)
            send_quietly(r.sock, b'{"type": "hel')  # and never another byte
            loris.append(r)
        legit_step(net, server)  # newcomers push the oldest strangers out
        assert all(closed_by_peer(r.sock, timeout=GUARD) for r in loris)
        assert not server.admission.pending
        assert_idle(server)

    def test_a_silent_stranger_is_dropped_after_the_hello_timeout(self, net, fast_hello):
        server = net.server(2)
        s = net.raw(server.port)
        t0 = time.monotonic()
        assert closed_by_peer(s.sock)
        assert 0.4 < time.monotonic() - t0 < GUARD

    def test_out_of_file_descriptors_accept_backs_off(self, net, procs, tmp_path):
        """A service in its own process with 48 descriptors, flooded: it does not
        spin on EMFILE, and once the flood is gone a node joins."""
        script = tmp_path / "server.py"
        script.write_text(
            "import resource, sys, time\n"
            "sys.path.insert(0, %r)\n"
            "import metaflow\n"
            "from metaflow_extensions.torchrun.plugins.torchrun.gang.config import GangConfig\n"
            "from metaflow_extensions.torchrun.plugins.torchrun.gang.server import GangServer\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))\n"
            "s = GangServer(GangConfig('hostile', 1, heartbeat_timeout=30), '127.0.0.1', [0], secret=%r)\n"
            "s.warn = lambda text: None\n"
            "s.start()\n"
            "print(s.port, flush=True)\n"
            "time.sleep(120)\n" % (os.getcwd(), SECRET))
        p = procs.popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                        env={**os.environ, "METAFLOW_USER": "tests"})
        port = int(p.stdout.readline())
        flood = []
        try:
            for _ in range(200):
                c = socket.socket()
                c.setblocking(False)
                c.connect_ex((HOST, port))
                flood.append(c)
            time.sleep(0.5)
            before = cpu_seconds(p.pid)
            time.sleep(2.0)
            used = cpu_seconds(p.pid) - before
            assert used < 0.5, "the service used %.2fs of CPU in 2s: spinning on accept" % used
        finally:
            for c in flood:
                c.close()
        client = GangClient(GangConfig("hostile", 1, heartbeat_timeout=30), HOST, [port], 0, secret=SECRET)
        net.clients.append(client)
        client.connect(give_up_after=10)
        assert client.cause is None and client._sock is not None


def cpu_seconds(pid: int) -> float:
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class TestMembersBreakingRules:
    """A peer with the secret is one of our nodes: it is trusted to be a node,
    not to be well-formed. Whatever it sends, the service survives, and a
    value whose MAC does not check out is never kept."""

    def member(self, net, server, node=1) -> RawPeer:
        r = net.raw(server.port)
        assert r.hello(server.config, node)["type"] == "welcome"
        return r

    def test_a_forged_rank0_mac_drops_the_member_and_keeps_nothing(self, net, tmp_path):
        marker = tmp_path / "executed"
        bad = pickle.dumps(Boom(str(marker)))
        server = net.server(2)
        (a,) = net.join(server, [0])
        m = self.member(net, server)
        t = threading.Thread(target=lambda: a.enter_call(0, "x"), daemon=True)
        t.start()
        m.send({"type": "call", "index": 0, "entry": "x"})
        t.join(GUARD)
        m.send({"type": "call_done", "index": 0, "rank0": base64.b64encode(bad).decode(), "rank0_proof": "0" * 64,
                "report": {}})
        (cause,) = wait_cause([a])
        assert (cause.kind, cause.node_index) == (CauseKind.NODE_LOST, 1)
        assert server.handlers.book.calls[0].rank0 is None and 1 not in server.handlers.book.calls[0].done
        assert not marker.exists()

    @pytest.mark.parametrize("proof_for", ["nothing", "another call", "another node", "other bytes"])
    def test_a_mac_for_something_else_is_refused(self, net, proof_for):
        server = net.server(2)
        (a,) = net.join(server, [0])
        m = self.member(net, server)
        t = threading.Thread(target=lambda: a.enter_call(0, "x"), daemon=True)
        t.start()
        m.send({"type": "call", "index": 0, "entry": "x"})
        t.join(GUARD)
        gid = server.config.gang_id
        proof = {"nothing": None,
                 "another call": gang_auth.payload_proof(SECRET, gid, 1, 1, b"data"),
                 "another node": gang_auth.payload_proof(SECRET, gid, 0, 0, b"data"),
                 "other bytes": gang_auth.payload_proof(SECRET, gid, 0, 1, b"date")}[proof_for]
        m.send({"type": "call_done", "index": 0, "rank0": base64.b64encode(b"data").decode(),
                "rank0_proof": proof})
        wait_cause([a])
        assert server.handlers.book.calls[0].rank0 is None

    @pytest.mark.parametrize("message", [
        {"type": "failed", "cause": "a string, not a cause"},
        {"type": "failed", "cause": {"kind": "failed", "summary": "s", "time": 10**400}},
        {"type": "failed", "cause": None, "call": 10**400},
        {"type": "call", "index": 0, "entry": ["not", "a", "string"]},
        {"type": "leave", "calls": "many", "ok": "yes"},
        {"type": "hb", "extra": [[[[1]]]]},
    ])
    def test_odd_fields_from_a_member_never_kill_the_service(self, net, message):
        server = net.server(3)
        (a,) = net.join(server, [0])
        m = self.member(net, server, node=2)
        m.send(message)
        time.sleep(0.3)
        assert server._thread.is_alive()
        # whatever the service made of it (a cause, a drop), it still serves
        assert net.raw(server.port).hello(server.config, 1)["type"] == "welcome"
        assert 1 in server.handlers.members.joined_at

    def test_a_member_sending_garbage_is_dropped_and_named(self, net):
        server = net.server(2)
        (a,) = net.join(server, [0])
        m = self.member(net, server)
        m.sock.sendall(b"[" * 100_000 + b"\n")
        (cause,) = wait_cause([a])
        assert (cause.kind, cause.node_index) == (CauseKind.NODE_LOST, 1)
        assert server._thread.is_alive()

    def test_a_member_over_the_line_limit_is_dropped(self, net):
        server = net.server(2)
        (a,) = net.join(server, [0])
        m = self.member(net, server)
        send_quietly(m.sock, b"x" * (wire.MAX_LINE + 10))
        (cause,) = wait_cause([a])
        assert (cause.kind, cause.node_index) == (CauseKind.NODE_LOST, 1)


class TestBigValues:
    def test_a_rank0_value_over_the_limit_is_named_not_lost(self, net):
        server = net.server(2)
        a, b = net.join(server, [0, 1])
        t = threading.Thread(target=lambda: a.enter_call(0, "x"), daemon=True)
        t.start()
        b.enter_call(0, "x")
        t.join(GUARD)
        b.call_done(0, b"z" * (wire.RANK0_MAX + 1), node_report(*range(10), tail_chars=1000))
        a.call_done(0, None, node_report())
        assert a.wait_call_done(0)  # no hang: the done arrived without the value
        call = server.handlers.book.calls[0]
        assert call.rank0 is None and "over the" in call.rank0_error and "node 1" in call.rank0_error

    def test_a_report_too_big_for_a_line_is_trimmed_not_lost(self, net):
        server = net.server(2)
        a, b = net.join(server, [0, 1])
        b.report_failure(Cause(CauseKind.RANK_FAILED, "the cause"), report=node_report(*range(100), tail_chars=1000))
        (cause,) = wait_cause([a])
        assert cause.summary == "the cause"
