"""gang.py: the cross-node liveness service, over real sockets on 127.0.0.1.

Every test uses real threads and real TCP connections; "nodes" are GangClients
in this process, raw sockets speaking the wire format, or real subprocesses
(killed with SIGKILL or frozen with SIGSTOP). Timeouts are small; the waits
below are hang guards, not measurements.

Where a test checks that something happens *without* waiting for a heartbeat
timeout (a lost connection, a reported failure), the gang is given a longer
heartbeat_timeout and the test checks the cause's kind, so that only the
mechanism under test can explain the result.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from metaflow_extensions.torchrun.plugins.torchrun import gang, topology
from proc_helpers import wait_until

HOST = "127.0.0.1"
LONG_HB = 4.0  # beyond any wait in a test that uses it (and server.close() is quick)
GUARD = 5.0  # hang guard for things expected "within about a second"

# A gang client in its own process: loads gang.py by path (no Metaflow, quick to
# start), joins, then idles so that it can be killed or frozen.
SUBPROCESS_CLIENT = r"""
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("gang_under_test", sys.argv[1])
gang = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = gang
spec.loader.exec_module(gang)
config = gang.GangConfig(sys.argv[2], int(sys.argv[3]), heartbeat_timeout=float(sys.argv[4]),
                         start_timeout=30)
client = gang.GangClient(config, "127.0.0.1", [int(sys.argv[5])], int(sys.argv[6]))
client.connect(give_up_after=20)
print("joined" if client.cause is None else "cause %r" % (client.cause,), flush=True)
while True:
    time.sleep(1)
"""


class Gangs:
    """Creates servers, clients and raw sockets, and closes them all at teardown."""

    def __init__(self) -> None:
        self.servers = []
        self.clients = []
        self.socks = []

    def config(self, num_nodes=3, heartbeat_timeout=LONG_HB, start_timeout=30.0, gang_id=None):
        return gang.GangConfig(
            gang_id=gang_id or "gang-%s" % uuid.uuid4().hex[:8],
            num_nodes=num_nodes,
            heartbeat_timeout=heartbeat_timeout,
            start_timeout=start_timeout,
        )

    def server(self, config=None, port=None, ports=None, announce=None, **kw):
        config = config or self.config(**kw)
        ports = ports or [port or topology.find_free_port()]
        s = gang.GangServer(config, HOST, ports, announce=announce)
        self.servers.append(s)
        return s.start()

    def client(self, config, port, node_index, connect=True, give_up_after=GUARD):
        """``port``: one port, or the candidate ports in order."""
        ports = [port] if isinstance(port, int) else list(port)
        c = gang.GangClient(config, HOST, ports, node_index)
        self.clients.append(c)
        if connect:
            c.connect(give_up_after=give_up_after)
        return c

    def join(self, server, nodes):
        clients = [self.client(server.config, server.port, n) for n in nodes]
        for c in clients:
            assert c.cause is None, c.cause
            assert c._sock is not None
        return clients

    def raw(self, port, timeout=GUARD):
        s = socket.create_connection((HOST, port), timeout=timeout)
        self.socks.append(s)
        return s

    def close_all(self) -> None:
        for c in self.clients:
            c.close()
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass
        for s in self.servers:
            if s._thread.is_alive() or s.listener.fileno() != -1:
                s.close()


@pytest.fixture
def gangs():
    g = Gangs()
    try:
        yield g
    finally:
        g.close_all()


def hello(config, node_index, host="raw-node", protocol=gang.PROTOCOL):
    return (
        json.dumps(
            {
                "type": "hello",
                "protocol": protocol,
                "gang_id": config.gang_id,
                "node_index": node_index,
                "host": host,
                "pid": 1,
            }
        )
        + "\n"
    ).encode()


def read_line(sock, timeout=GUARD):
    sock.settimeout(timeout)
    data = b""
    while b"\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return json.loads(data.split(b"\n", 1)[0])


def wait_cause(clients, timeout=GUARD):
    assert wait_until(lambda: all(c.cause is not None for c in clients), timeout), [
        (c.node_index, c.cause) for c in clients
    ]
    return [c.cause for c in clients]


def start_subprocess_client(procs, config, port, node_index):
    return procs.popen(
        [
            sys.executable,
            "-c",
            SUBPROCESS_CLIENT,
            gang.__file__,
            config.gang_id,
            str(config.num_nodes),
            str(config.heartbeat_timeout),
            str(port),
            str(node_index),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )


def join_subprocess(procs, server, node_index):
    p = start_subprocess_client(procs, server.config, server.port, node_index)
    line = p.stdout.readline().decode().strip()  # the child prints once connect() returned
    assert line == "joined", line
    assert node_index in server.joined_at
    return p


# -- joining ------------------------------------------------------------------


class TestJoin:
    def test_three_nodes_join(self, gangs):
        server = gangs.server(num_nodes=3)
        assert server.missing() == [0, 1, 2]
        clients = gangs.join(server, [0, 1, 2])
        assert wait_until(lambda: all(c.joined == [0, 1, 2] for c in clients), GUARD), [
            c.joined for c in clients
        ]
        assert server.missing() == []
        assert sorted(server.joined_at) == [0, 1, 2]
        assert server.cause is None
        assert all(c.cause is None and c.abort_reason() is None for c in clients)
        assert not any(c.all_done.is_set() for c in clients)

    def test_joined_grows_as_nodes_arrive(self, gangs):
        server = gangs.server(num_nodes=3)
        (c0,) = gangs.join(server, [0])
        assert wait_until(lambda: c0.joined == [0], GUARD), c0.joined
        assert server.missing() == [1, 2]
        gangs.join(server, [2])
        assert wait_until(lambda: c0.joined == [0, 2], GUARD), c0.joined
        assert server.missing() == [1]

    def test_a_client_that_starts_before_the_server_connects_when_it_comes_up(self, gangs):
        config = gangs.config(num_nodes=2)
        port = topology.find_free_port()
        early = gangs.client(config, port, 1, connect=False)
        t = threading.Thread(target=early.connect, kwargs={"give_up_after": 15}, daemon=True)
        t.start()
        time.sleep(1.0)
        assert t.is_alive(), "connect() gave up while the server was not up yet"
        assert early._sock is None and early.cause is None
        server = gangs.server(config, port=port)
        t.join(GUARD)
        assert not t.is_alive(), "connect() did not return once the server was up"
        assert early.cause is None, early.cause
        gangs.join(server, [0])
        assert wait_until(lambda: early.joined == [0, 1], GUARD), early.joined
        assert server.missing() == []

    def test_another_gang_is_rejected_and_does_not_count(self, gangs):
        server = gangs.server(num_nodes=2)
        (c0,) = gangs.join(server, [0])
        intruder_config = gangs.config(num_nodes=2, gang_id=server.config.gang_id + "-other")
        started = time.monotonic()
        intruder = gangs.client(intruder_config, server.port, 1, give_up_after=1.0)
        assert time.monotonic() - started < GUARD
        assert intruder.cause is not None
        assert intruder.cause["kind"] == "control_unreachable"
        assert "another gang" in intruder.cause["summary"]
        assert intruder._sock is None
        assert server.missing() == [1]
        assert 1 not in server.joined_at
        time.sleep(0.3)
        assert c0.joined == [0]
        # Being turned away is no failure of the gang.
        assert server.cause is None and c0.cause is None

    def test_wrong_protocol_is_rejected(self, gangs):
        server = gangs.server(num_nodes=2)
        raw = gangs.raw(server.port)
        raw.sendall(hello(server.config, 1, protocol=gang.PROTOCOL + 1))
        reply = read_line(raw)
        assert reply["type"] == "reject"
        assert raw.recv(100) == b""  # and the server hung up
        assert server.missing() == [0, 1]

    def test_a_raw_hello_gets_the_welcome(self, gangs):
        server = gangs.server(num_nodes=2)
        raw = gangs.raw(server.port)
        raw.sendall(hello(server.config, 1))
        assert read_line(raw) == {"type": "welcome", "cause": None, "announce": {}}
        assert server.missing() == [0]

    def test_a_late_joiner_learns_the_existing_cause_at_once(self, gangs):
        server = gangs.server(num_nodes=3)
        c0, c1 = gangs.join(server, [0, 1])
        c1.report_failure({"summary": "rank 3 crashed"})
        wait_cause([c0, c1])
        late = gangs.client(server.config, server.port, 2)
        # Set by the welcome, before connect() returned.
        assert late.cause is not None
        assert late.cause["kind"] == "failed"
        assert late.cause["node_index"] == 1
        assert late.abort_reason() == "rank 3 crashed"

    def test_strangers_sending_non_json_do_not_disturb_the_gang(self, gangs):
        server = gangs.server(num_nodes=3)
        c0, c1 = gangs.join(server, [0, 1])
        stranger = gangs.raw(server.port)
        stranger.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\xff\xfe not json\n")
        stranger.close()
        time.sleep(0.3)
        assert server._thread.is_alive()
        assert server.cause is None and c0.cause is None and c1.cause is None
        raw = gangs.raw(server.port)
        raw.sendall(hello(server.config, 2))
        assert read_line(raw)["type"] == "welcome"  # still answering
        assert server.missing() == []

    @pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
    def test_a_json_line_that_is_not_an_object_does_not_kill_the_server(self, gangs):
        server = gangs.server(num_nodes=2)
        stranger = gangs.raw(server.port)
        stranger.sendall(b"1\n")
        time.sleep(0.3)
        assert server._thread.is_alive()
        raw = gangs.raw(server.port)
        raw.sendall(hello(server.config, 1))
        assert read_line(raw, timeout=2)["type"] == "welcome"


# -- failures -----------------------------------------------------------------


class TestReportedFailure:
    SUMMARY = "node 1, rank 5 (local rank 1, pid 42 on h1): ValueError: boom"

    def test_every_node_learns_the_failure_and_the_first_one_wins(self, gangs):
        server = gangs.server(num_nodes=3)
        c0, c1, c2 = gangs.join(server, [0, 1, 2])
        c1.report_failure(
            {"kind": "failed", "node_index": 1, "rank": 5, "exit_code": 1, "summary": self.SUMMARY}
        )
        # A long heartbeat timeout: only the report can explain this.
        for cause in wait_cause([c0, c1, c2], timeout=GUARD):
            assert cause["kind"] == "failed"
            assert cause["node_index"] == 1
            assert cause["summary"] == self.SUMMARY
            assert cause["rank"] == 5 and cause["exit_code"] == 1
        assert all(c.abort_reason() == self.SUMMARY for c in (c0, c1, c2))
        assert server.cause["node_index"] == 1

        c2.report_failure({"kind": "failed", "node_index": 2, "summary": "node 2: later"})
        time.sleep(0.5)
        for c in (c0, c1, c2):
            assert c.cause["node_index"] == 1
            assert c.abort_reason() == self.SUMMARY
        assert server.cause["node_index"] == 1
        assert server.cause["summary"] == self.SUMMARY
        # What the service holds, not only what the clients kept: a newcomer is told node 1.
        probe = gangs.raw(server.port)
        probe.sendall(hello(server.config, 2))
        welcome = read_line(probe)
        assert welcome["cause"]["node_index"] == 1
        assert welcome["cause"]["summary"] == self.SUMMARY

    def test_what_a_client_heard_first_stays_when_the_control_then_goes(self, gangs):
        server = gangs.server(num_nodes=3)
        c0, c1, c2 = gangs.join(server, [0, 1, 2])
        c1.report_failure({"summary": "the root cause"})
        wait_cause([c0, c1, c2])
        server.close()  # the control exits after the abort; node 2 is still stopping
        assert wait_until(lambda: not c2._threads[0].is_alive(), GUARD)
        assert c2.cause["kind"] == "failed"
        assert c2.abort_reason() == "the root cause"

    def test_the_service_names_the_reporting_node_and_the_kind(self, gangs):
        server = gangs.server(num_nodes=3)
        c0, c1, c2 = gangs.join(server, [0, 1, 2])
        c2.report_failure({"kind": "whatever", "summary": "s"})
        for cause in wait_cause([c0, c1, c2]):
            assert cause["kind"] == "failed"
            assert cause["node_index"] == 2
            assert isinstance(cause["time"], float)

    def test_failure_of_the_control_node_itself(self, gangs):
        server = gangs.server(num_nodes=2)
        c0, c1 = gangs.join(server, [0, 1])
        c0.report_failure({"summary": "control's rank 0 died"})
        for cause in wait_cause([c0, c1]):
            assert (cause["kind"], cause["node_index"]) == ("failed", 0)

    def test_nothing_happens_before_a_failure(self, gangs):
        server = gangs.server(num_nodes=2, heartbeat_timeout=0.5)
        c0, c1 = gangs.join(server, [0, 1])
        # Several heartbeat timeouts: heartbeats flow both ways and keep the gang up.
        time.sleep(1.5)
        assert server.cause is None
        assert c0.cause is None and c1.cause is None


class TestSecondaryFailure:
    """A node whose ranks only lost a peer (gloo: "Connection closed by peer")
    often reports before the node where the real failure happened."""

    ECHO = {"summary": "node 0, rank 1: RuntimeError: Connection closed by peer", "secondary": True}

    def test_a_real_failure_arriving_within_the_grace_wins_over_an_echo(self, gangs):
        server = gangs.server(num_nodes=3)
        c0, c1, c2 = gangs.join(server, [0, 1, 2])
        c0.report_failure(dict(self.ECHO))
        time.sleep(0.3)
        assert server.cause is None and c2.cause is None  # held back, not yet told
        c1.report_failure({"summary": "node 1, rank 3: killed by signal SIGSEGV"})
        for cause in wait_cause([c0, c1, c2]):
            assert (cause["kind"], cause["node_index"]) == ("failed", 1)
            assert "SIGSEGV" in cause["summary"]

    def test_an_echo_alone_becomes_the_cause_after_the_grace(self, gangs):
        server = gangs.server(num_nodes=2)
        c0, c1 = gangs.join(server, [0, 1])
        t0 = time.monotonic()
        c1.report_failure(dict(self.ECHO))
        for cause in wait_cause([c0, c1]):
            assert cause["node_index"] == 1 and cause["secondary"] is True
        took = time.monotonic() - t0
        assert server.config.secondary_grace * 0.9 <= took < server.config.secondary_grace + GUARD

    def test_an_echoing_node_that_exits_is_not_taken_for_a_lost_node(self, gangs):
        server = gangs.server(num_nodes=3)
        c0, c1, c2 = gangs.join(server, [0, 1, 2])
        c2.report_failure(dict(self.ECHO))
        time.sleep(0.2)
        c2.close()
        for cause in wait_cause([c0, c1]):
            assert (cause["kind"], cause["node_index"]) == ("failed", 2)

    def test_a_lost_node_during_the_grace_is_the_cause(self, gangs):
        server = gangs.server(num_nodes=3)
        c0, c1, c2 = gangs.join(server, [0, 1, 2])
        c0.report_failure(dict(self.ECHO))
        time.sleep(0.2)
        c1.close()  # its task died: that explains the echo
        for cause in wait_cause([c0, c2]):
            assert (cause["kind"], cause["node_index"]) == ("node_lost", 1)


class TestLostNode:
    def test_a_killed_subprocess_node_is_lost_at_once(self, gangs, procs):
        server = gangs.server(num_nodes=3)
        c0, c1 = gangs.join(server, [0, 1])
        p = join_subprocess(procs, server, 2)
        assert wait_until(lambda: c0.joined == [0, 1, 2], GUARD)
        os.kill(p.pid, signal.SIGKILL)
        for cause in wait_cause([c0, c1], timeout=GUARD):
            assert cause["kind"] == "node_lost"
            assert cause["node_index"] == 2
            assert cause["summary"].startswith("node 2 (%s) disconnected" % socket.gethostname())
        assert server.cause["kind"] == "node_lost"

    def test_a_client_closed_before_it_reported_done(self, gangs):
        server = gangs.server(num_nodes=3)
        c0, c1, c2 = gangs.join(server, [0, 1, 2])
        c1.close()
        for cause in wait_cause([c0, c2], timeout=GUARD):
            assert (cause["kind"], cause["node_index"]) == ("node_lost", 1)

    def test_a_failed_node_that_then_exits_stays_the_root_cause(self, gangs):
        server = gangs.server(num_nodes=3)
        c0, c1, c2 = gangs.join(server, [0, 1, 2])
        c1.report_failure({"summary": "the real reason"})
        wait_cause([c0, c2])
        c1.close()
        time.sleep(0.5)
        for c in (c0, c2):
            assert c.cause["kind"] == "failed" and c.abort_reason() == "the real reason"
        assert server.cause["kind"] == "failed"


class TestDone:
    def test_all_done(self, gangs):
        server = gangs.server(num_nodes=3)
        clients = gangs.join(server, [0, 1, 2])
        clients[0].report_done()
        clients[1].report_done()
        # Not everyone has finished: the control keeps waiting.
        assert clients[0].wait_all_done(timeout=0.5) is False
        assert not any(c.all_done.is_set() for c in clients)
        clients[2].report_done()
        assert clients[0].wait_all_done(timeout=GUARD) is True
        assert wait_until(lambda: all(c.all_done.is_set() for c in clients), GUARD)
        assert server.done == {0, 1, 2}
        assert server.cause is None
        assert all(c.cause is None for c in clients)

    def test_disconnecting_after_done_does_not_abort(self, gangs):
        server = gangs.server(num_nodes=3)
        c0, c1, c2 = gangs.join(server, [0, 1, 2])
        # What a worker does when its torchrun succeeded: report, then go.
        c2.report_done()
        c2.close()
        assert wait_until(lambda: 2 not in server._by_node, GUARD)
        time.sleep(0.3)
        assert server.cause is None
        assert c0.cause is None and c1.cause is None
        c1.report_done()
        c1.close()
        assert wait_until(lambda: 1 not in server._by_node, GUARD)
        assert c0.cause is None
        c0.report_done()
        assert c0.wait_all_done(timeout=GUARD) is True
        assert c0.all_done.is_set()
        assert server.cause is None and c0.cause is None

    def test_a_finished_node_whose_control_goes_away_is_not_aborted(self, gangs):
        server = gangs.server(num_nodes=2)
        c0, c1 = gangs.join(server, [0, 1])
        c1.report_done()
        time.sleep(0.2)
        server.close()
        assert wait_until(lambda: not any(t.is_alive() for t in c1._threads[:1]), GUARD)
        assert c1.cause is None

    def test_wait_all_done_returns_false_when_the_gang_aborts(self, gangs):
        server = gangs.server(num_nodes=3)
        c0, c1, c2 = gangs.join(server, [0, 1, 2])
        c0.report_done()
        c2.report_done()
        threading.Timer(0.3, c1.report_failure, args=({"summary": "late failure"},)).start()
        started = time.monotonic()
        assert c0.wait_all_done(timeout=20) is False
        assert time.monotonic() - started < GUARD
        assert c0.abort_reason() == "late failure"


class TestSilentNode:
    def test_a_raw_node_that_says_hello_then_nothing(self, gangs):
        server = gangs.server(num_nodes=3, heartbeat_timeout=1.5)
        c0, c1 = gangs.join(server, [0, 1])
        silent = gangs.raw(server.port)
        silent.sendall(hello(server.config, 2, host="silent-host"))
        assert read_line(silent)["type"] == "welcome"
        assert wait_until(lambda: c0.joined == [0, 1, 2], GUARD)
        time.sleep(0.2)
        assert c0.cause is None  # silence is tolerated for heartbeat_timeout
        for cause in wait_cause([c0, c1], timeout=GUARD + 1.5):
            assert cause["kind"] == "unresponsive"
            assert cause["node_index"] == 2
            assert cause["summary"].startswith("node 2 (silent-host) sent no heartbeat")
            assert "heartbeat_timeout=1.5s" in cause["summary"]
        assert (server.cause["kind"], server.cause["node_index"]) == ("unresponsive", 2)

    def test_a_frozen_subprocess_node(self, gangs, procs):
        server = gangs.server(num_nodes=3, heartbeat_timeout=1.5)
        c0, c1 = gangs.join(server, [0, 1])
        p = join_subprocess(procs, server, 2)
        time.sleep(0.5)
        assert server.cause is None  # it heartbeats while it runs
        os.kill(p.pid, signal.SIGSTOP)
        try:
            for cause in wait_cause([c0, c1], timeout=GUARD + 1.5):
                assert (cause["kind"], cause["node_index"]) == ("unresponsive", 2)
        finally:
            os.kill(p.pid, signal.SIGKILL)
        p.wait(GUARD)
        time.sleep(0.3)
        # Its connection closing afterwards changes nothing: the first cause stays.
        assert server.cause["kind"] == "unresponsive"
        assert c0.cause["kind"] == "unresponsive"

    def test_a_node_that_reported_done_may_go_quiet(self, gangs):
        server = gangs.server(num_nodes=2, heartbeat_timeout=0.5)
        (c0,) = gangs.join(server, [0])
        quiet = gangs.raw(server.port)
        quiet.sendall(hello(server.config, 1))
        read_line(quiet)
        quiet.sendall(b'{"type": "done"}\n')
        time.sleep(1.5)
        assert server.cause is None and c0.cause is None


class TestStartTimeout:
    def test_a_node_that_never_joins(self, gangs):
        server = gangs.server(num_nodes=3, start_timeout=2.0)
        c0, c1 = gangs.join(server, [0, 1])
        time.sleep(0.5)
        assert c0.cause is None
        for cause in wait_cause([c0, c1], timeout=GUARD):
            assert cause["kind"] == "never_joined"
            assert cause["missing"] == [2]
            assert cause["summary"].startswith("node 2 did not join within 2s")
            assert "(2 of 3 joined)" in cause["summary"]
        assert server.cause["missing"] == [2]

    def test_several_missing_nodes_are_all_named(self, gangs):
        server = gangs.server(num_nodes=3, start_timeout=1.0)
        (c0,) = gangs.join(server, [0])
        (cause,) = wait_cause([c0], timeout=GUARD)
        assert cause["kind"] == "never_joined"
        assert cause["missing"] == [1, 2]
        assert cause["summary"].startswith("nodes 1, 2 did not join within 1s (1 of 3 joined)")

    def test_no_start_timeout_once_everyone_joined(self, gangs):
        server = gangs.server(num_nodes=2, start_timeout=0.5)
        c0, c1 = gangs.join(server, [0, 1])
        time.sleep(1.2)
        assert server.cause is None and c0.cause is None and c1.cause is None


class TestControl:
    def test_control_lost(self, gangs):
        server = gangs.server(num_nodes=3)
        c0, c1, c2 = gangs.join(server, [0, 1, 2])
        server.close()
        # Long heartbeat timeout: the closed connection alone explains this.
        for cause in wait_cause([c1, c2], timeout=GUARD):
            assert cause["kind"] == "control_lost"
            assert cause["node_index"] == 0

    def test_control_unresponsive(self, gangs):
        listener = socket.socket()
        gangs.socks.append(listener)
        listener.bind((HOST, 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        got = {}

        def fake_control():
            conn, _ = listener.accept()
            gangs.socks.append(conn)
            got["hello"] = read_line(conn)
            # The welcome exactly as GangServer sends it, then silence.
            welcome = {"type": "welcome", "cause": None, "announce": {"rdzv_port": 29999}}
            conn.sendall((json.dumps(welcome) + "\n").encode())

        t = threading.Thread(target=fake_control, daemon=True)
        t.start()
        config = gangs.config(num_nodes=2, heartbeat_timeout=1.0)
        client = gangs.client(config, port, 1)
        t.join(GUARD)
        assert got["hello"]["type"] == "hello"
        assert got["hello"]["gang_id"] == config.gang_id
        assert got["hello"]["node_index"] == 1
        assert got["hello"]["protocol"] == gang.PROTOCOL
        assert client.cause is None
        assert client.announce == {"rdzv_port": 29999}
        (cause,) = wait_cause([client], timeout=GUARD + 1.0)
        assert cause["kind"] == "control_unresponsive"
        assert cause["node_index"] == 0
        assert "heartbeat_timeout=1s" in cause["summary"]

    def test_control_unreachable(self, gangs):
        config = gangs.config(num_nodes=2)
        client = gangs.client(config, topology.find_free_port(), 1, give_up_after=0.5)
        assert client.cause["kind"] == "control_unreachable"
        assert client.abort_reason().startswith("could not reach the control node's gang service")


class TestPorts:
    """The service listens on the first free candidate port; nodes try them in order."""

    def test_the_server_skips_a_port_that_is_taken(self, gangs):
        taken = socket.socket()
        gangs.socks.append(taken)
        taken.bind((HOST, 0))
        taken.listen(1)
        busy = taken.getsockname()[1]
        free = topology.find_free_port(avoid=(busy,))
        server = gangs.server(ports=[busy, free], num_nodes=1)
        assert server.port == free
        (c0,) = gangs.join(server, [0])
        assert c0.port == free

    def test_no_free_port_names_them_all(self, gangs):
        held = []
        for _ in range(2):
            s = socket.socket()
            gangs.socks.append(s)
            s.bind((HOST, 0))
            s.listen(1)
            held.append(s.getsockname()[1])
        with pytest.raises(OSError) as e:
            gang.GangServer(gangs.config(num_nodes=1), HOST, held)
        for port in held:
            assert str(port) in str(e.value)

    def test_a_client_passes_over_another_gangs_service(self, gangs):
        other = gangs.server(num_nodes=2)
        ours = gangs.server(num_nodes=2)
        (c0,) = gangs.join(ours, [0])
        c1 = gangs.client(ours.config, [other.port, ours.port], 1)
        assert c1.cause is None, c1.cause
        assert c1.port == ours.port
        assert ours.missing() == []
        assert other.missing() == [0, 1] and other.cause is None
        assert wait_until(lambda: c0.joined == [0, 1], GUARD)

    def test_a_client_passes_over_an_unrelated_server(self, gangs):
        listener = socket.socket()
        gangs.socks.append(listener)
        listener.bind((HOST, 0))
        listener.listen(8)
        stop = threading.Event()

        def hang_up_on_everyone():
            listener.settimeout(0.1)
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                conn.close()

        t = threading.Thread(target=hang_up_on_everyone, daemon=True)
        t.start()
        try:
            ours = gangs.server(num_nodes=1)
            c0 = gangs.client(ours.config, [listener.getsockname()[1], ours.port], 0)
            assert c0.cause is None, c0.cause
            assert c0.port == ours.port
        finally:
            stop.set()
            t.join(GUARD)

    def test_a_client_passes_over_a_server_greeting_with_a_json_array(self, gangs):
        listener = socket.socket()
        gangs.socks.append(listener)
        listener.bind((HOST, 0))
        listener.listen(8)
        stop = threading.Event()

        def greet_and_hang_up():
            listener.settimeout(0.1)
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                conn.sendall(b"[1, 2]\n")
                conn.close()

        t = threading.Thread(target=greet_and_hang_up, daemon=True)
        t.start()
        try:
            ours = gangs.server(num_nodes=1)
            c0 = gangs.client(ours.config, [listener.getsockname()[1], ours.port], 0)
            assert c0.cause is None, c0.cause
            assert c0.port == ours.port
        finally:
            stop.set()
            t.join(GUARD)

    def test_every_node_is_told_the_announcement(self, gangs):
        server = gangs.server(num_nodes=2, announce={"rdzv_port": 29512})
        clients = gangs.join(server, [0, 1])
        assert [c.announce for c in clients] == [{"rdzv_port": 29512}] * 2
        raw = gangs.raw(server.port)
        raw.sendall(hello(server.config, 1))
        assert read_line(raw)["announce"] == {"rdzv_port": 29512}

    def test_unreachable_names_every_port(self, gangs):
        a = topology.find_free_port()
        b = topology.find_free_port(avoid=(a,))
        client = gangs.client(gangs.config(num_nodes=2), [a, b], 1, give_up_after=0.5)
        assert client.cause["kind"] == "control_unreachable"
        assert "%d or %d" % (a, b) in client.cause["summary"]
        assert client.port is None and client.announce == {}


def test_heartbeat_interval():
    assert gang.GangConfig("g", 2, heartbeat_timeout=30).heartbeat_interval == 1.0
    assert gang.GangConfig("g", 2, heartbeat_timeout=2).heartbeat_interval == pytest.approx(0.2)
    assert gang.GangConfig("g", 2, heartbeat_timeout=0.1).heartbeat_interval == 0.05
