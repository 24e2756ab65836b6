"""The gang service and its clients over real sockets on 127.0.0.1: joining,
the per-call barrier, leaving, liveness, and peers that do not play by the rules.

"Nodes" are GangClients in this process, raw sockets, or a real subprocess
(SIGKILLed). Waits are hang guards, not measurements.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import uuid

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from metaflow_extensions.torchrun.plugins.torchrun import gang_wire as wire
from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.gang import GangConfig
from metaflow_extensions.torchrun.plugins.torchrun.gang_client import GangClient
from metaflow_extensions.torchrun.plugins.torchrun.gang_server import GangServer
from metaflow_extensions.torchrun.plugins.torchrun.ports import find_free_port

HOST = "127.0.0.1"
GUARD = 5.0


def wait_until(predicate, timeout=GUARD):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def net():
    made = {"servers": [], "clients": [], "socks": []}

    class Net:
        def server(self, num_nodes=2, **kw):
            config = GangConfig("g-" + uuid.uuid4().hex[:8], num_nodes, **kw)
            s = GangServer(config, HOST, [find_free_port()]).start()
            made["servers"].append(s)
            return s

        def client(self, server, node):
            c = GangClient(server.config, HOST, [server.port], node)
            made["clients"].append(c)
            c.connect(give_up_after=GUARD)
            return c

        def raw(self, server):
            s = socket.create_connection((HOST, server.port), timeout=GUARD)
            made["socks"].append(s)
            return s

    yield Net()
    for c in made["clients"]:
        c.close()
    for s in made["socks"]:
        s.close()
    for s in made["servers"]:
        s.close()


def hello(config, node):
    return wire.encode({"type": "hello", "protocol": wire.PROTOCOL, "gang_id": config.gang_id,
                        "node_index": node, "host": "raw", "pid": 1})


class TestCalls:
    def test_go_only_once_every_node_entered_and_each_call_has_its_own_port(self, net):
        server = net.server(2)
        a, b = net.client(server, 0), net.client(server, 1)
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("a0", a.enter_call(0, "train.py")))
        t.start()
        time.sleep(0.3)
        assert t.is_alive(), "no go before node 1 entered call 0"
        got["b0"] = b.enter_call(0, "train.py")
        t.join(GUARD)
        assert got["a0"] == got["b0"] is not None
        t = threading.Thread(target=lambda: got.setdefault("a1", a.enter_call(1, "eval.py")))
        t.start()
        got["b1"] = b.enter_call(1, "eval.py")
        t.join(GUARD)
        assert got["a1"] == got["b1"] is not None and got["a1"] != got["a0"]

    def test_different_entrypoints_are_named(self, net):
        server = net.server(2)
        a, b = net.client(server, 0), net.client(server, 1)
        threading.Thread(target=lambda: a.enter_call(0, "train.py"), daemon=True).start()
        assert b.enter_call(0, "eval.py") is None
        assert b.cause.kind is CauseKind.CALL_MISMATCH
        summary = b.cause.summary
        assert "call 1 of current.torch.run differs between nodes" in summary
        assert "node 1 runs 'eval.py'" in summary and "node 0 runs 'train.py'" in summary

    def test_call_done_of_every_node_reaches_the_control(self, net):
        server = net.server(2)
        a, b = net.client(server, 0), net.client(server, 1)
        threading.Thread(target=lambda: a.enter_call(0, "x"), daemon=True).start()
        b.enter_call(0, "x")
        a.call_done(0, None, {"ranks": []})
        time.sleep(0.2)
        assert server.calls[0].done == {0}
        b.call_done(0, b"rank0 bytes", {"ranks": []})
        assert a.wait_call_done(0)
        assert server.calls[0].done == {0, 1}

    def test_a_call_nobody_else_reaches_times_out_naming_the_absent(self, net):
        server = net.server(2, start_timeout=0.5)
        a, _ = net.client(server, 0), net.client(server, 1)
        assert a.enter_call(0, "x") is None
        assert a.cause.kind is CauseKind.CALL_TIMEOUT
        assert "node 1 did not reach call 1" in a.cause.summary


class TestLeaving:
    def test_left_nodes_are_not_lost_and_all_left_is_said(self, net):
        server = net.server(2, heartbeat_timeout=0.5)
        a, b = net.client(server, 0), net.client(server, 1)
        b.leave(0, ok=True)
        b.close()
        time.sleep(1.0)  # beyond the heartbeat timeout: a left node's silence means nothing
        assert server.cause is None
        a.leave(0, ok=True)
        assert a.wait_all_left()

    def test_leaving_with_fewer_calls_than_another_made_is_named(self, net):
        server = net.server(2)
        a, b = net.client(server, 0), net.client(server, 1)
        threading.Thread(target=lambda: a.enter_call(0, "x"), daemon=True).start()
        assert wait_until(lambda: server.node_calls.get(0) == 1)
        b.leave(0, ok=True)
        assert wait_until(lambda: server.cause is not None)
        assert server.cause.kind is CauseKind.LEFT_EARLY and server.cause.node_index == 1

    def test_a_killed_node_is_lost_at_once(self, net):
        server = net.server(2, heartbeat_timeout=30)
        net.client(server, 0)
        code = (
            "import sys, time, socket, json\n"
            "s = socket.create_connection(('127.0.0.1', %d))\n"
            "s.sendall(%r)\n"
            "s.recv(1000)\n"
            "print('joined', flush=True)\n"
            "time.sleep(60)\n" % (server.port, hello(server.config, 1))
        )
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        try:
            assert proc.stdout.readline().strip() == b"joined"
            proc.kill()
            assert wait_until(lambda: server.cause is not None, 3)
            assert server.cause.kind is CauseKind.NODE_LOST and server.cause.node_index == 1
        finally:
            proc.kill()
            proc.wait()


class TestRules:
    def test_a_node_index_is_held_by_one_connection(self, net):
        server = net.server(2)
        net.client(server, 1)
        other = GangClient(server.config, HOST, [server.port], 1)
        other.connect(give_up_after=0.5)
        assert other._sock is None  # refused: the real node 1 keeps its place
        other.close()
        assert server.cause is None and 1 in server._by_node

    def test_garbage_huge_and_deep_lines_do_not_kill_the_service(self, net):
        server = net.server(2)
        a = net.client(server, 0)
        for payload in (b"[" * 100_000 + b"\n", b"x" * (wire.MAX_LINE + 10), b"\xff\xfe\n",
                        json.dumps({"type": "hello", "node_index": 1e400}).encode() + b"\n"):
            s = net.raw(server)
            try:
                s.sendall(payload)
            except OSError:
                pass
        time.sleep(0.3)
        assert server._thread.is_alive() and server.cause is None
        b = net.client(server, 1)
        assert b._sock is not None and a.cause is None

    def test_bad_fields_from_a_member_drop_that_member_only(self, net):
        server = net.server(3)
        net.client(server, 0)
        s = net.raw(server)
        s.sendall(hello(server.config, 2))
        s.recv(4096)
        s.sendall(wire.encode({"type": "failed", "cause": "a string, not a cause"}))
        s.sendall(wire.encode({"type": "call_done", "index": 0, "rank0": "!!!not base64"}))
        time.sleep(0.3)
        assert server._thread.is_alive()
        # The member spoke out of turn (a done for a call it never entered): dropped,
        # which the gang takes for a lost node, naming it: never a crash.
        assert server.cause is None or server.cause.node_index == 2

    def test_a_peer_silent_before_hello_is_dropped(self, net, monkeypatch):
        from metaflow_extensions.torchrun.plugins.torchrun import gang_server

        monkeypatch.setattr(gang_server, "HELLO_TIMEOUT", 0.3)
        server = net.server(2)
        s = net.raw(server)
        s.settimeout(GUARD)
        assert s.recv(10) == b""  # closed by the service


class TestCause:
    def test_round_trip(self):
        c = Cause(CauseKind.STEP_FAILED, "node 1 failed", node_index=1, exc_type="E", traceback="tb",
                  missing=(2, 3), call=4)
        back = Cause.from_wire(json.loads(json.dumps(c.to_wire())))
        assert back == c

    @pytest.mark.parametrize(
        "data",
        [None, "text", [], {}, {"kind": "nope", "summary": "s"}, {"kind": "failed"},
         {"kind": "failed", "summary": 3}],
    )
    def test_not_a_cause(self, data):
        assert Cause.from_wire(data) is None

    def test_hostile_fields_are_dropped_or_cut(self):
        c = Cause.from_wire({"kind": "failed", "summary": "s" * 10_000, "node_index": 1e400,
                             "rank": True, "missing": [1, "x", 2**40], "time": float("nan")})
        assert c is not None and len(c.summary) < 5000
        assert c.node_index is None and c.rank is None and c.missing == (1,)
