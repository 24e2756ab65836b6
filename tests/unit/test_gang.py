"""The step-long gang over real sockets on 127.0.0.1: joining, failures and
their root cause, lost, frozen and missing nodes, the control going away,
ports, the per-call barrier, leaving, and the typed Cause on the wire.

"Nodes" are GangClients in this process, raw sockets speaking the wire format
by hand (``gang_net.RawPeer``), or gang clients in their own processes that
are SIGKILLed or SIGSTOPped. Where a test checks that something happens
*without* a heartbeat timeout, the gang's heartbeat timeout is long
(``LONG_HB``) and the cause's kind is checked, so that only the mechanism under
test explains the result. Waits are hang guards, not measurements.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from gang_net import GUARD, HOST, SECRET, new_config, read_line, wait_cause, node_report
from metaflow_extensions.torchrun.plugins.torchrun.gang import wire
from metaflow_extensions.torchrun.plugins.torchrun.gang import messages
from metaflow_extensions.torchrun.plugins.torchrun.procs.flight import OK, FlightGroup, FlightSummary
from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.gang.config import GangConfig
from metaflow_extensions.torchrun.plugins.torchrun.gang.client import GangClient
from metaflow_extensions.torchrun.plugins.torchrun.gang.calls import CallState
from metaflow_extensions.torchrun.plugins.torchrun.gang.server import GangServer
from metaflow_extensions.torchrun.plugins.torchrun.gang.ports import find_free_port
from proc_helpers import wait_until


def enter_in_background(client, index, entry="train.py"):
    """``enter_call`` blocks until the service answers: run it on a thread."""
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("port", client.enter_call(index, entry)), daemon=True)
    t.start()
    return t, got


def through_call(clients, index, entry="train.py"):
    """Every client enters call ``index``; their rendezvous ports."""
    started = [enter_in_background(c, index, entry) for c in clients]
    for t, _ in started:
        t.join(GUARD)
        assert not t.is_alive(), "no go for call %d" % index
    return [got["port"] for _, got in started]


# -- joining ---------------------------------------------------------------------


class TestJoin:
    def test_three_nodes_join(self, net):
        server = net.server(3)
        assert server.missing() == [0, 1, 2]
        clients = net.join(server, [0, 1, 2])
        assert wait_until(lambda: server.missing() == [], GUARD)
        assert server.missing() == [] and server.everyone_heard()
        assert server.cause is None and all(c.cause is None for c in clients)
        assert all(c.port == server.port for c in clients)

    def test_joined_grows_as_nodes_arrive(self, net):
        server = net.server(3)
        net.join(server, [0])
        assert wait_until(lambda: server.missing() == [1, 2], GUARD)
        net.join(server, [2])
        assert wait_until(lambda: server.missing() == [1], GUARD)

    def test_a_client_that_starts_before_the_service_joins_when_it_comes_up(self, net):
        config = new_config(2)
        port = find_free_port()
        early = net.client(config, port, 1, connect=False)
        t = threading.Thread(target=early.connect, kwargs={"give_up_after": 15}, daemon=True)
        t.start()
        time.sleep(0.8)
        assert t.is_alive() and early._sock is None and early.cause is None
        server = net.server(config=config, ports=[port])
        t.join(GUARD)
        assert not t.is_alive() and early.cause is None
        assert server.missing() == [0]

    def test_start_joins_in_the_background(self, net):
        server = net.server(2)
        c = GangClient(server.config, HOST, [server.port], 1, secret=SECRET)
        net.clients.append(c)
        c.start()
        assert c.wait_joined() is True
        assert wait_until(lambda: 1 in server.handlers.members.joined_at, GUARD)

    def test_a_reader_whose_socket_was_closed_before_it_began_ends_quietly(self, net):
        """close() may run before the reader thread sets its socket's timeout:
        the reader ends without an error (it raised EBADF in its thread)."""
        server = net.server(2)
        c = GangClient(server.config, HOST, [server.port], 1, secret=SECRET)
        a, b = socket.socketpair()
        b.close()
        a.close()
        c._sock = a
        c._closing.set()
        c._read_loop()  # returns, raises nothing
        assert c.cause is None

    def test_another_gang_is_turned_away_and_does_not_count(self, net):
        server = net.server(2)
        (c0,) = net.join(server, [0])
        other = new_config(2)  # same secret, another gang id: still not ours
        intruder = net.client(other, server.port, 1, give_up_after=0.6)
        assert intruder._sock is None
        assert intruder.cause.kind is CauseKind.CONTROL_UNREACHABLE
        assert "not authenticated" in intruder.cause.summary
        assert server.missing() == [1]
        time.sleep(0.2)
        assert server.cause is None and c0.cause is None and server.missing() == [1]

    def test_another_protocol_is_turned_away(self, net):
        server = net.server(2)
        raw = net.raw(server.port)
        assert raw.hello(server.config, 1, protocol=messages.PROTOCOL + 1) == {"type": "reject",
                                                                            "reason": "not authenticated"}
        assert server.missing() == [0, 1]

    def test_a_late_joiner_learns_the_cause_in_its_welcome(self, net):
        server = net.server(3)
        c0, c1 = net.join(server, [0, 1])
        c1.report_failure(Cause(CauseKind.RANK_FAILED, "rank 3 crashed", rank=3))
        wait_cause([c0, c1])
        late = net.client(server.config, server.port, 2)
        assert late.cause is not None  # set from the welcome, before connect() returned
        assert (late.cause.kind, late.cause.node_index, late.cause.rank) == (CauseKind.RANK_FAILED, 1, 3)
        assert late.cause.summary == "rank 3 crashed"

    @pytest.mark.parametrize("junk", [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\xff\xfe not json\n", b"1\n",
                                      b"[1, 2]\n", b'"hello"\n', b"null\n"])
    def test_strangers_sending_junk_are_dropped_and_the_gang_goes_on(self, net, junk):
        server = net.server(3)
        c0, c1 = net.join(server, [0, 1])
        stranger = net.raw(server.port)
        stranger.read_challenge()
        stranger.sock.sendall(junk)
        if junk.endswith(b"\n"):
            assert read_line(stranger.sock) == {}  # hung up on, told nothing
        time.sleep(0.2)
        assert server._thread.is_alive()
        assert server.cause is None and c0.cause is None and c1.cause is None
        net.join(server, [2])  # still answering
        assert server.missing() == []

    def test_a_node_index_is_held_by_one_connection(self, net):
        server = net.server(2)
        (real,) = net.join(server, [1])
        twin = net.raw(server.port)
        assert twin.hello(server.config, 1) == {"type": "reject", "reason": "node 1 is taken"}
        time.sleep(0.2)
        assert server.handlers.members.by_node[1].host == socket.gethostname()  # the real node 1 keeps its place
        assert server.cause is None and real.cause is None

    def test_a_node_that_left_cannot_come_back(self, net):
        server = net.server(2)
        a, b = net.join(server, [0, 1])
        b.leave(0, ok=True)
        assert wait_until(lambda: 1 in server.handlers.members.left, GUARD)
        b.close()
        again = net.raw(server.port)
        assert again.hello(server.config, 1)["type"] == "reject"

    @pytest.mark.parametrize("node", [2, 1 << 30, -1])
    def test_a_node_index_out_of_range_is_turned_away(self, net, node):
        server = net.server(2)
        raw = net.raw(server.port)
        assert raw.hello(server.config, node)["type"] == "reject"
        assert server.missing() == [0, 1] and server.cause is None


# -- reported failures -----------------------------------------------------------------


class TestReportedFailure:
    SUMMARY = "node 1, rank 5 (local rank 1, pid 42 on h1): ValueError: boom"

    def test_every_node_learns_the_failure_and_the_first_one_wins(self, net):
        server = net.server(3)
        c0, c1, c2 = net.join(server, [0, 1, 2])
        c1.report_failure(Cause(CauseKind.RANK_FAILED, self.SUMMARY, rank=5, exit_code=1), call=None)
        for cause in wait_cause([c0, c1, c2]):
            assert (cause.kind, cause.node_index, cause.rank, cause.exit_code) == (CauseKind.RANK_FAILED, 1, 5, 1)
            assert cause.summary == self.SUMMARY
        c2.report_failure(Cause(CauseKind.RANK_FAILED, "later"))
        time.sleep(0.4)
        assert all(c.cause.summary == self.SUMMARY for c in (c0, c1, c2))
        assert server.cause.summary == self.SUMMARY
        # What the service holds, not only what the clients kept:
        probe = net.raw(server.port)
        assert probe.hello(server.config, 2)["type"] == "reject"  # node 2 is still there
        c2.close()
        assert wait_until(lambda: 2 not in server.handlers.members.by_node, GUARD)
        assert Cause.from_wire(net.raw(server.port).hello(server.config, 2)["cause"]).summary == self.SUMMARY

    def test_the_service_stamps_who_sent_it(self, net):
        server = net.server(3)
        c0, c1, c2 = net.join(server, [0, 1, 2])
        c2.report_failure(Cause(CauseKind.RANK_FAILED, "s", node_index=0))  # a node speaks for itself only
        for cause in wait_cause([c0, c1, c2]):
            assert cause.node_index == 2 and isinstance(cause.time, float)

    def test_failure_of_the_control_node_itself(self, net):
        server = net.server(2)
        c0, c1 = net.join(server, [0, 1])
        c0.report_failure(Cause(CauseKind.STEP_FAILED, "control's step raised"))
        for cause in wait_cause([c0, c1]):
            assert (cause.kind, cause.node_index) == (CauseKind.STEP_FAILED, 0)

    def test_what_a_client_heard_first_stays_when_the_control_then_goes(self, net):
        server = net.server(3)
        c0, c1, c2 = net.join(server, [0, 1, 2])
        c1.report_failure(Cause(CauseKind.RANK_FAILED, "the root cause"))
        wait_cause([c0, c1, c2])
        server.close()
        time.sleep(0.3)
        assert c2.cause.summary == "the root cause"

    def test_nothing_happens_without_a_failure(self, net):
        server = net.server(2, heartbeat_timeout=0.5)
        c0, c1 = net.join(server, [0, 1])
        time.sleep(1.5)  # three heartbeat timeouts: heartbeats flow both ways
        assert server.cause is None and c0.cause is None and c1.cause is None

    def test_wait_for_verdict_hears_the_cause(self, net):
        server = net.server(2)
        c0, c1 = net.join(server, [0, 1])
        c1.report_failure(Cause(CauseKind.STEP_FAILED, "x"))
        assert c1.wait_for_verdict(GUARD).node_index == 1

    def test_on_abort_is_called_once(self, net):
        server = net.server(2)
        seen = []
        c0 = net.client(server.config, server.port, 0, on_abort=seen.append)
        c1 = net.client(server.config, server.port, 1)
        c1.report_failure(Cause(CauseKind.STEP_FAILED, "x"))
        c1.report_failure(Cause(CauseKind.STEP_FAILED, "y"))
        wait_cause([c0])
        time.sleep(0.3)
        assert [c.summary for c in seen] == ["x"]


class TestSecondaryFailure:
    """A node whose ranks only lost a peer often reports before the node where
    the real failure happened: its report is held ``secondary_grace``."""

    ECHO = Cause(CauseKind.RANK_FAILED, "node 0, rank 1: Connection closed by peer", secondary=True)

    def test_a_real_failure_within_the_grace_wins_over_an_echo(self, net):
        server = net.server(3)
        c0, c1, c2 = net.join(server, [0, 1, 2])
        c0.report_failure(self.ECHO)
        assert wait_until(lambda: server.handlers.pending is not None, GUARD)
        assert server.cause is None and c2.cause is None  # held, not told yet
        c1.report_failure(Cause(CauseKind.RANK_FAILED, "node 1: SIGSEGV"))
        for cause in wait_cause([c0, c1, c2]):
            assert cause.node_index == 1 and "SIGSEGV" in cause.summary

    def test_an_echo_alone_becomes_the_cause_after_the_grace(self, net):
        server = net.server(2)
        c0, c1 = net.join(server, [0, 1])
        t0 = time.monotonic()
        c1.report_failure(self.ECHO)
        for cause in wait_cause([c0, c1]):
            assert cause.node_index == 1 and cause.secondary
        assert time.monotonic() - t0 >= server.config.secondary_grace * 0.9

    def test_an_echoing_node_that_exits_is_not_taken_for_a_lost_node(self, net):
        server = net.server(3)
        c0, c1, c2 = net.join(server, [0, 1, 2])
        c2.report_failure(self.ECHO)
        assert wait_until(lambda: server.handlers.pending is not None, GUARD)  # held when it exits
        c2.close()
        for cause in wait_cause([c0, c1]):
            assert (cause.kind, cause.node_index) == (CauseKind.RANK_FAILED, 2)

    def test_a_lost_node_during_the_grace_is_the_cause(self, net):
        server = net.server(3)
        c0, c1, c2 = net.join(server, [0, 1, 2])
        c0.report_failure(self.ECHO)
        assert wait_until(lambda: server.handlers.pending is not None, GUARD)  # held when node 1 dies
        c1.close()  # its task died: that explains the echo
        for cause in wait_cause([c0, c2]):
            assert (cause.kind, cause.node_index) == (CauseKind.NODE_LOST, 1)


# -- lost, frozen and missing nodes -----------------------------------------------------


class TestLostNode:
    def test_a_killed_subprocess_node_is_lost_at_once(self, net):
        server = net.server(3)
        c0, c1 = net.join(server, [0, 1])
        p = net.subprocess_node(server, 2)
        os.kill(p.pid, signal.SIGKILL)
        for cause in wait_cause([c0, c1]):
            assert (cause.kind, cause.node_index) == (CauseKind.NODE_LOST, 2)
            assert cause.summary.startswith("node 2 (%s) disconnected" % socket.gethostname()[:255])

    def test_a_client_closed_before_it_left(self, net):
        server = net.server(3)
        c0, c1, c2 = net.join(server, [0, 1, 2])
        c1.close()
        for cause in wait_cause([c0, c2]):
            assert (cause.kind, cause.node_index) == (CauseKind.NODE_LOST, 1)

    def test_a_failed_node_that_then_exits_stays_the_root_cause(self, net):
        server = net.server(3)
        c0, c1, c2 = net.join(server, [0, 1, 2])
        c1.report_failure(Cause(CauseKind.RANK_FAILED, "the real reason"))
        wait_cause([c0, c2])
        c1.close()
        time.sleep(0.4)
        assert c0.cause.summary == c2.cause.summary == server.cause.summary == "the real reason"


class TestSilentNode:
    def test_a_raw_node_that_says_hello_then_nothing(self, net):
        server = net.server(3, heartbeat_timeout=1.5)
        c0, c1 = net.join(server, [0, 1])
        silent = net.raw(server.port)
        assert silent.hello(server.config, 2, host="silent-host")["type"] == "welcome"
        time.sleep(0.3)
        assert c0.cause is None  # silence is tolerated for heartbeat_timeout
        for cause in wait_cause([c0, c1], GUARD + 1.5):
            assert (cause.kind, cause.node_index) == (CauseKind.UNRESPONSIVE, 2)
            assert cause.summary.startswith("node 2 (silent-host) sent no heartbeat")
            assert "heartbeat_timeout=1.5s" in cause.summary

    def test_a_frozen_subprocess_node(self, net):
        server = net.server(3, heartbeat_timeout=1.5)
        c0, c1 = net.join(server, [0, 1])
        p = net.subprocess_node(server, 2)
        time.sleep(0.5)
        assert server.cause is None  # it heartbeats while it runs
        os.kill(p.pid, signal.SIGSTOP)
        try:
            for cause in wait_cause([c0, c1], GUARD + 1.5):
                assert (cause.kind, cause.node_index) == (CauseKind.UNRESPONSIVE, 2)
        finally:
            os.kill(p.pid, signal.SIGKILL)
        p.wait(GUARD)
        time.sleep(0.3)
        assert server.cause.kind is CauseKind.UNRESPONSIVE  # its connection closing changes nothing

    def test_a_node_that_left_may_go_quiet_and_go_away(self, net):
        server = net.server(2, heartbeat_timeout=0.5)
        (c0,) = net.join(server, [0])
        quiet = net.raw(server.port)
        quiet.hello(server.config, 1)
        quiet.send({"type": "leave", "calls": 0, "ok": True})
        time.sleep(1.5)  # three heartbeat timeouts
        assert server.cause is None and c0.cause is None
        quiet.close()
        time.sleep(0.3)
        assert server.cause is None and c0.cause is None  # and its going is no loss


class TestStartTimeout:
    def test_a_node_that_never_joins(self, net):
        server = net.server(3, start_timeout=1.5)
        c0, c1 = net.join(server, [0, 1])
        for cause in wait_cause([c0, c1], GUARD):
            assert cause.kind is CauseKind.NEVER_JOINED and cause.missing == (2,)
            assert cause.summary.startswith("node 2 did not join within 1.5s (2 of 3 joined)")
            assert cause.node_index is None

    def test_several_missing_nodes_are_all_named(self, net):
        server = net.server(3, start_timeout=1.0)
        (c0,) = net.join(server, [0])
        (cause,) = wait_cause([c0])
        assert cause.missing == (1, 2)
        assert cause.summary.startswith("nodes 1, 2 did not join within 1s (1 of 3 joined)")

    def test_no_start_timeout_once_everyone_joined(self, net):
        server = net.server(2, start_timeout=0.5)
        c0, c1 = net.join(server, [0, 1])
        time.sleep(1.2)
        assert server.cause is None and c0.cause is None and c1.cause is None

    def test_the_last_progress_is_heard_at_once_and_summed_up_for_the_record(self, net, monkeypatch):
        """A call's ranks ended at step 12 while the paced heartbeats last
        carried step 5 (the next is a minute away here): the node's last
        progress, sent as its ranks are gone, is the record's step, with no
        check of the book in between."""
        from metaflow_extensions.torchrun.plugins.torchrun.base import timeouts
        from metaflow_extensions.torchrun.plugins.torchrun.gang.gang_progress import NodeProgress

        monkeypatch.setattr(timeouts, "PROGRESS_SEND", 60.0)
        monkeypatch.setattr(timeouts, "PROGRESS_CHECK", 60.0)
        server = net.server(2)
        c0, c1 = net.join(server, [0, 1])

        def at(step):
            return lambda: NodeProgress(ranks=1, step_min=step, step_median=step, step_max=step, total=12,
                                        rank_lo=1, rank_hi=1, stalled=0.0)

        quiet = lambda: None  # noqa: E731
        with c0.watching(quiet, at(12)), c1.watching(quiet, at(5)):
            assert wait_until(lambda: server.progress_record().step == 5, GUARD), server.progress_record()
        with c0.watching(quiet, at(12)), c1.watching(quiet, at(12)):
            time.sleep(1.5)  # heartbeats go on, without progress
            assert server.progress_record().step == 5
        # The start's end sends its last progress, before the node's report.
        assert wait_until(lambda: server.progress_record().step == 12, 1.0), server.progress_record()

    def test_progress_names_the_missing(self, net):
        said = []
        server = net.server(3, progress_interval=0.2, hooks=dict(progress=said.append))
        net.join(server, [0])
        assert wait_until(lambda: any("nodes 1, 2 missing" in s for s in said), GUARD), said
        net.join(server, [1, 2])
        assert wait_until(lambda: said[-1] == "all 3 nodes are there", GUARD), said


# -- the control -------------------------------------------------------------------------


class TestControl:
    def test_control_lost(self, net):
        server = net.server(3)
        c0, c1, c2 = net.join(server, [0, 1, 2])
        server.close()
        for cause in wait_cause([c1, c2]):
            assert (cause.kind, cause.node_index) == (CauseKind.CONTROL_LOST, 0)

    def test_control_unresponsive(self, net):
        """A service that welcomes properly and then says nothing."""
        config = new_config(2, heartbeat_timeout=1.0)
        listener = net.listener()
        from metaflow_extensions.torchrun.plugins.torchrun.gang import auth as gang_auth

        def fake_control():
            conn, _ = listener.accept()
            net.socks.append(conn)
            nonce = gang_auth.new_nonce()
            conn.sendall(wire.encode(gang_auth.challenge(nonce).to_wire()))
            hello = read_line(conn)
            node, their = gang_auth.check_hello(SECRET, config.gang_id, nonce, hello, 2)
            conn.sendall(wire.encode(gang_auth.welcome(SECRET, config.gang_id, nonce, their, node, cause=None).to_wire()))

        t = threading.Thread(target=fake_control, daemon=True)
        t.start()
        client = net.client(config, listener.getsockname()[1], 1)
        t.join(GUARD)
        assert client.cause is None and client._sock is not None
        (cause,) = wait_cause([client], GUARD + 1.0)
        assert (cause.kind, cause.node_index) == (CauseKind.CONTROL_UNRESPONSIVE, 0)
        assert "heartbeat_timeout=1s" in cause.summary

    def test_control_unreachable_names_every_port(self, net):
        a = find_free_port()
        b = find_free_port()
        client = net.client(new_config(2), [a, b], 1, give_up_after=0.5)
        assert client.cause.kind is CauseKind.CONTROL_UNREACHABLE
        assert client.cause.summary.startswith("could not reach the control node's gang service")
        assert "%d or %d" % (a, b) in client.cause.summary
        assert client.port is None and client.wait_joined() is False

    def test_a_node_that_cannot_reach_the_control_says_what_it_tries_while_it_tries(self, net):
        a, b = find_free_port(), find_free_port()
        said = []
        client = net.client(new_config(2, progress_interval=0.4), [a, b], 1, connect=False, progress=said.append)
        client.connect(give_up_after=2.0)
        assert client.cause.kind is CauseKind.CONTROL_UNREACHABLE
        assert 2 <= len(said) <= 5, said  # every progress_interval, one line each time
        for line in said:
            assert line.startswith("still trying to reach the control node's gang service at %s port %d or %d: "
                                   % (HOST, a, b)), line
            assert line.endswith("(last error: [Errno 111] Connection refused)"), line
        assert "(last error: [Errno 111] Connection refused)" in client.cause.summary

    def test_no_attempt_outlives_the_patience(self, net):
        """Services that accept and never greet: each attempt is cut at the
        deadline, not after its own full timeout (a worker cut off before it
        joined gave up 9 s late, one attempt per candidate port)."""
        mute = [net.listener().getsockname()[1] for _ in range(3)]
        client = net.client(new_config(2), mute, 1, connect=False)
        started = time.monotonic()
        client.connect(give_up_after=1.0)
        assert client.cause.kind is CauseKind.CONTROL_UNREACHABLE
        assert time.monotonic() - started < 1.9  # one attempt alone took 2 s before

    def test_a_left_node_whose_control_goes_away_is_not_aborted(self, net):
        server = net.server(2)
        c0, c1 = net.join(server, [0, 1])
        c1.leave(0, ok=True)
        assert wait_until(lambda: 1 in server.handlers.members.left, GUARD)
        server.close()
        time.sleep(0.4)
        assert c1.cause is None


class TestPorts:
    def test_the_service_skips_a_port_that_is_taken(self, net):
        busy = net.listener().getsockname()[1]
        free = find_free_port()
        server = net.server(1, ports=[busy, free])
        assert server.port == free
        (c0,) = net.join(server, [0])
        assert c0.port == free

    def test_no_free_port_names_them_all(self, net):
        held = [net.listener().getsockname()[1] for _ in range(2)]
        with pytest.raises(OSError) as e:
            GangServer(new_config(1), HOST, held, secret=SECRET)
        assert all(str(port) in str(e.value) for port in held)

    def test_a_client_passes_over_another_gangs_service(self, net):
        other = net.server(2, secret=b"o" * 32)
        ours = net.server(2)
        (c0,) = net.join(ours, [0])
        c1 = net.client(ours.config, [other.port, ours.port], 1)
        assert c1.cause is None and c1.port == ours.port
        assert other.missing() == [0, 1] and other.cause is None
        assert wait_until(lambda: ours.missing() == [], GUARD) and c0.cause is None

    @pytest.mark.parametrize("greeting", [b"SSH-2.0-OpenSSH_9.6\r\n", b"[1, 2]\n", b"", b"x" * 100_000,
                                          b'{"type": "challenge", "protocol": 3, "nonce": "00"}\n'])
    def test_a_client_passes_over_an_unrelated_server(self, net, greeting):
        listener = net.listener()
        listener.settimeout(0.1)
        stop = threading.Event()

        def greet_and_hang_up():
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                try:
                    conn.sendall(greeting)
                except OSError:
                    pass
                conn.close()

        t = threading.Thread(target=greet_and_hang_up, daemon=True)
        t.start()
        try:
            ours = net.server(1)
            c0 = net.client(ours.config, [listener.getsockname()[1], ours.port], 0)
            assert c0.cause is None and c0.port == ours.port
        finally:
            stop.set()
            t.join(GUARD)

    def test_a_client_passes_over_a_server_that_says_nothing(self, net):
        silent = net.listener()  # accepts (the kernel does) and never speaks
        ours = net.server(1)
        t0 = time.monotonic()
        c0 = net.client(ours.config, [silent.getsockname()[1], ours.port], 0)
        assert c0.cause is None and c0.port == ours.port
        assert time.monotonic() - t0 < GUARD


# -- the per-call barrier -------------------------------------------------------------------


class TestCalls:
    def test_each_node_goes_as_soon_as_it_enters(self, net):
        """Node 0 first (as locally, where the control task starts first): a
        node's torchrun starts while later nodes are still on their way; all
        get the same port, and the call counts as entered by all only
        once the last one arrives (what the call timeout and hang detection
        count from)."""
        server = net.server(3)
        a, b, c = net.join(server, [0, 1, 2])
        port_a = a.enter_call(0, "train.py")
        assert port_a is not None and port_a != server.port
        assert server.handlers.book.calls[0].all_entered_at is None
        port_b = b.enter_call(0, "train.py")
        assert server.handlers.book.calls[0].all_entered_at is None
        port_c = c.enter_call(0, "train.py")
        assert port_a == port_b == port_c == server.handlers.book.calls[0].rdzv_port
        assert wait_until(lambda: server.handlers.book.calls[0].all_entered_at is not None, GUARD)

    def test_other_nodes_wait_for_the_node_that_hosts_the_store(self, net):
        """Node 0's torchrun hosts the rendezvous store, which another node's
        torchrun looks for only 60 s (torch's read_timeout): nobody launches
        before node 0 is there, everybody waiting goes when it comes."""
        server = net.server(3)
        a, b, c = net.join(server, [0, 1, 2])
        tb, got_b = enter_in_background(b, 0)
        tc, got_c = enter_in_background(c, 0)
        assert wait_until(lambda: len(server.handlers.book.calls.get(0, CallState(0)).entries) == 2, GUARD)
        time.sleep(0.4)
        assert tb.is_alive() and tc.is_alive(), "no go before node 0 entered"
        assert server.handlers.book.calls[0].rdzv_port is None
        port = a.enter_call(0, "train.py")
        tb.join(GUARD)
        tc.join(GUARD)
        assert got_b["port"] == got_c["port"] == port == server.handlers.book.calls[0].rdzv_port is not None

    def test_a_late_node_still_times_out_after_the_others_went(self, net):
        server = net.server(2, start_timeout=0.5)
        a, b = net.join(server, [0, 1])
        assert a.enter_call(0, "x") is not None
        for cause in wait_cause([a, b]):
            assert (cause.kind, cause.call, cause.missing) == (CauseKind.CALL_TIMEOUT, 0, (1,))

    def test_each_call_has_its_own_rendezvous_port(self, net):
        server = net.server(2)
        clients = net.join(server, [0, 1])
        ports = [through_call(clients, i, "step%d.py" % i)[0] for i in range(3)]
        assert len(set(ports)) == 3 and server.port not in ports
        assert sorted(server.handlers.book.calls) == [0, 1, 2]

    def test_different_entrypoints_are_named(self, net):
        server = net.server(2)
        a, b = net.join(server, [0, 1])
        enter_in_background(a, 0, "train.py")
        assert wait_until(lambda: 0 in server.handlers.book.calls, GUARD)
        assert b.enter_call(0, "eval.py") is None
        for cause in wait_cause([a, b]):
            assert (cause.kind, cause.node_index, cause.call) == (CauseKind.CALL_MISMATCH, 1, 0)
            assert "call 1 of current.torch.run differs between nodes" in cause.summary
            assert "node 1 runs 'eval.py'" in cause.summary and "node 0 runs 'train.py'" in cause.summary

    def test_call_all_done_once_every_node_is_done(self, net):
        server = net.server(3)
        clients = net.join(server, [0, 1, 2])
        through_call(clients, 0)
        clients[0].call_done(0, None, node_report(0))
        clients[1].call_done(0, None, node_report(1))
        assert not wait_until(lambda: clients[0].news.call_over(0), 0.4)
        clients[2].call_done(0, None, node_report(2))
        assert clients[0].wait_call_done(0) is True
        # Only the control waits for it: the others are not told.
        time.sleep(0.2)
        assert not any(c.news.call_over(0) for c in clients[1:])
        call = server.handlers.book.calls[0]
        assert call.done == {0, 1, 2} and call.reports == {n: node_report(n) for n in range(3)}
        assert sorted(call.finished_at) == [0, 1, 2]

    def test_rank0_bytes_reach_the_control_from_another_node(self, net):
        server = net.server(2)
        a, b = net.join(server, [0, 1])
        through_call([a, b], 0)
        a.call_done(0, None, node_report())
        b.call_done(0, b"\x80\x04rank0 pickle", node_report())
        assert a.wait_call_done(0)
        call = server.handlers.book.calls[0]
        assert (call.rank0, call.rank0_node, call.rank0_error) == (b"\x80\x04rank0 pickle", 1, None)

    def test_wait_call_done_is_false_when_the_gang_aborts(self, net):
        server = net.server(2)
        a, b = net.join(server, [0, 1])
        through_call([a, b], 0)
        a.call_done(0, None, node_report())
        threading.Timer(0.3, b.report_failure, args=(Cause(CauseKind.RANK_FAILED, "late"),)).start()
        t0 = time.monotonic()
        assert a.wait_call_done(0) is False
        assert time.monotonic() - t0 < GUARD and a.cause.summary == "late"

    def test_a_call_nobody_else_reaches_times_out_naming_the_absent(self, net):
        server = net.server(2, start_timeout=0.5)
        a, _ = net.join(server, [0, 1])
        assert a.enter_call(0, "x") is not None
        (cause,) = wait_cause([a])
        assert (cause.kind, cause.call, cause.missing) == (CauseKind.CALL_TIMEOUT, 0, (1,))
        assert "node 1 did not reach call 1" in cause.summary

    @pytest.mark.parametrize("message", [
        {"type": "call", "index": 1, "entry": "x"},  # skips call 0
        {"type": "call", "index": "0", "entry": "x"},
        {"type": "call_done", "index": 0},  # never entered call 0
        {"type": "nonsense"},
        {"type": "stacks", "call": 5, "stacks": {}},  # a call it never entered
        {"type": "stacks", "call": "0", "stacks": {}},
        {"type": "stacks", "stacks": {}},
        *({"type": "hb", "quiet": q} for q in ("1", -1, 1e12, True, [1], {"a": 1})),  # a bad silence
    ])
    def test_a_member_out_of_turn_is_dropped_and_named(self, net, message):
        server = net.server(2)
        (a,) = net.join(server, [0])
        raw = net.raw(server.port)
        raw.hello(server.config, 1)
        raw.send(message)
        (cause,) = wait_cause([a])
        assert (cause.kind, cause.node_index) == (CauseKind.NODE_LOST, 1)
        assert server._thread.is_alive()

    def test_done_twice_or_before_the_go_is_out_of_turn(self, net):
        for early in (True, False):
            server = net.server(2)
            (a,) = net.join(server, [0])
            raw = net.raw(server.port)
            raw.hello(server.config, 1)
            raw.send({"type": "call", "index": 0, "entry": "x"})
            if not early:
                through_call([a], 0, "x")
                raw.send({"type": "call_done", "index": 0, "report": {}})
                assert wait_until(lambda: 1 in server.handlers.book.calls[0].done, GUARD)
            raw.send({"type": "call_done", "index": 0, "report": {}})
            (cause,) = wait_cause([a])
            assert (cause.kind, cause.node_index) == (CauseKind.NODE_LOST, 1)


# -- leaving -------------------------------------------------------------------------------


class TestLeaving:
    def test_all_left_once_every_node_left(self, net):
        server = net.server(3)
        clients = net.join(server, [0, 1, 2])
        clients[1].leave(0, ok=True)
        clients[2].leave(0, ok=True)
        assert not wait_until(lambda: clients[0].all_left.is_set(), 0.4)
        clients[0].leave(0, ok=True)
        assert clients[0].wait_all_left() is True
        # Only the control waits for it: the others are not told.
        time.sleep(0.2)
        assert not any(c.all_left.is_set() for c in clients[1:])
        assert server.cause is None and server.handlers.members.left == {0: (0, True), 1: (0, True), 2: (0, True)}

    def test_leaving_exempts_a_node_from_heartbeats_and_from_node_lost(self, net):
        server = net.server(2, heartbeat_timeout=0.5)
        a, b = net.join(server, [0, 1])
        b.leave(0, ok=True)
        assert wait_until(lambda: 1 in server.handlers.members.left, GUARD)
        b.close()
        time.sleep(1.2)  # beyond the heartbeat timeout
        assert server.cause is None and a.cause is None
        a.leave(0, ok=True)
        assert a.wait_all_left()

    def test_a_frozen_node_after_it_left_is_no_failure(self, net):
        server = net.server(2, heartbeat_timeout=1.0)
        (a,) = net.join(server, [0])
        p = net.subprocess_node(server, 1)
        p.stdin.write(b"leave\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == b"left"
        assert wait_until(lambda: 1 in server.handlers.members.left, GUARD)
        os.kill(p.pid, signal.SIGSTOP)
        try:
            time.sleep(2.0)  # twice the heartbeat timeout
            assert server.cause is None and a.cause is None
        finally:
            os.kill(p.pid, signal.SIGKILL)
        p.wait(GUARD)
        time.sleep(0.3)
        assert server.cause is None and a.cause is None  # nor is its death

    def test_a_node_leaving_while_another_waits_in_its_next_call_is_named_at_once(self, net):
        server = net.server(2)
        a, b = net.join(server, [0, 1])
        through_call([a, b], 0)
        t, _ = enter_in_background(a, 1)
        assert wait_until(lambda: 1 in server.handlers.book.calls, GUARD)
        t0 = time.monotonic()
        b.leave(1, ok=True)
        for cause in wait_cause([a]):
            assert (cause.kind, cause.node_index, cause.call) == (CauseKind.LEFT_EARLY, 1, 1)
            assert cause.summary.startswith("node 1 ended its step after 1 call of current.torch.run "
                                            "while node 0 waits in call 2")
        assert time.monotonic() - t0 < 1.0  # at once, not at a timeout
        t.join(GUARD)
        assert not t.is_alive()

    def test_a_node_entering_a_call_another_left_before_is_named(self, net):
        server = net.server(2)
        a, b = net.join(server, [0, 1])
        b.leave(0, ok=True)
        assert wait_until(lambda: 1 in server.handlers.members.left, GUARD)
        assert a.enter_call(0, "train.py") is None
        assert (a.cause.kind, a.cause.node_index, a.cause.call) == (CauseKind.LEFT_EARLY, 1, 0)
        assert "while node 0 waits in call 1" in a.cause.summary

    def test_a_leave_counts_the_calls_the_service_saw_not_the_claim(self, net):
        server = net.server(2)
        a, b = net.join(server, [0, 1])
        through_call([a, b], 0)
        a.leave(1, ok=True)
        b.leave(2, ok=True)  # claims a call it never entered
        assert a.wait_all_left() and server.cause is None
        assert server.handlers.members.left == {0: (1, True), 1: (1, True)}

    def test_leave_counts_differing_name_the_node_with_fewer(self, net):
        server = net.server(3)
        a, b, c = net.join(server, [0, 1, 2])
        through_call([a, b, c], 0)
        enter_in_background(a, 1, "eval.py")
        enter_in_background(b, 1, "eval.py")
        calls = server.handlers.book.calls
        assert wait_until(lambda: 1 in calls and len(calls[1].entries) == 2, GUARD)
        c.leave(1, ok=True)
        for cause in wait_cause([a, b, c]):
            assert (cause.kind, cause.node_index, cause.call) == (CauseKind.LEFT_EARLY, 2, 1)
            assert "node 2 ended its step after 1 call of current.torch.run while node 0 waits in call 2" \
                in cause.summary

    def test_leaving_with_an_error_fails_the_gang_naming_the_node(self, net):
        server = net.server(2)
        a, b = net.join(server, [0, 1])
        b.leave(0, ok=False)
        for cause in wait_cause([a, b]):
            assert (cause.kind, cause.node_index) == (CauseKind.STEP_FAILED, 1)

    def test_after_leaving_only_heartbeats_are_heard(self, net):
        server = net.server(2)
        (a,) = net.join(server, [0])
        raw = net.raw(server.port)
        raw.hello(server.config, 1)
        raw.send({"type": "leave", "calls": 0, "ok": True})
        raw.send({"type": "hb"})
        assert wait_until(lambda: 1 in server.handlers.members.left, GUARD)
        raw.send({"type": "failed", "cause": Cause(CauseKind.RANK_FAILED, "too late").to_wire()})
        assert wait_until(lambda: 1 not in server.handlers.members.by_node, GUARD)  # dropped
        time.sleep(0.2)
        assert server.cause is None and a.cause is None


# -- typed causes ----------------------------------------------------------------------------


class TestCause:
    @pytest.mark.parametrize("kind", list(CauseKind))
    def test_every_kind_round_trips_through_json(self, kind):
        c = Cause(kind, "summary of %s" % kind.value, node_index=1, rank=2, local_rank=0, exit_code=-9,
                  exc_type="E", message="m", traceback="tb", secondary=True, missing=(2, 3), call=4)
        back = Cause.from_wire(json.loads(json.dumps(c.to_wire())))
        assert back == c

    def test_optional_fields_stay_off_the_wire(self):
        data = Cause(CauseKind.NODE_LOST, "s").to_wire()
        assert set(data) == {"kind", "summary", "secondary", "missing", "time"}
        assert Cause.from_wire(data) == Cause(CauseKind.NODE_LOST, "s", time=data["time"])

    @pytest.mark.parametrize("data", [
        None, "text", 3, [], {}, {"kind": "nope", "summary": "s"}, {"kind": "failed"},
        {"kind": "failed", "summary": ""}, {"kind": "failed", "summary": 3}, {"kind": ["failed"], "summary": "s"},
        {"kind": {"a": 1}, "summary": "s"}, {"kind": None, "summary": "s"},
    ])
    def test_what_is_not_a_cause(self, data):
        assert Cause.from_wire(data) is None

    def test_hostile_fields_are_dropped_or_cut(self):
        c = Cause.from_wire({
            "kind": "failed", "summary": "s" * 10_000, "node_index": 1e400, "rank": True, "local_rank": "1",
            "exit_code": 2**40, "exc_type": ["x"], "message": {"a": 1}, "traceback": "t" * 200_000,
            "secondary": "yes", "missing": [1, "x", 2**40, None, 2.5, False], "call": -(2**40),
            "time": 10**400,
        })
        assert c is not None and c.summary.startswith("s" * 100) and len(c.summary) < 4100
        assert (c.node_index, c.rank, c.local_rank, c.exit_code, c.exc_type, c.message, c.call) == (None,) * 7
        assert len(c.traceback) < 70_000 and c.secondary is False and c.missing == (1,)
        assert abs(c.time - time.time()) < 60

    @pytest.mark.parametrize("stamp", [float("nan"), float("inf"), "1", None, True, 10**400, -(10**400)])
    def test_a_bad_time_is_replaced_by_now(self, stamp):
        c = Cause.from_wire({"kind": "failed", "summary": "s", "time": stamp})
        assert abs(c.time - time.time()) < 60

    def test_a_huge_missing_list_is_capped(self):
        c = Cause.from_wire({"kind": "never_joined", "summary": "s", "missing": list(range(100_000))})
        assert len(c.missing) == 1024

    def test_with_node_stamps_the_sender(self):
        assert Cause(CauseKind.RANK_FAILED, "s", node_index=0).with_node(3).node_index == 3


def test_heartbeat_interval():
    assert GangConfig("g", 2, heartbeat_timeout=30).heartbeat_interval == 1.0
    assert GangConfig("g", 2, heartbeat_timeout=2).heartbeat_interval == pytest.approx(0.2)
    assert GangConfig("g", 2, heartbeat_timeout=0.1).heartbeat_interval == 0.05


# -- hang_timeout: silence across the gang -------------------------------------------


_WATCHING = []  # held: a context manager collected while entered would exit


def _watching(client, quiet):
    """As a call's start does while its ranks run: heartbeats carry ``quiet`` (until the client closes)."""
    watching = client.watching(quiet, lambda: None)
    watching.__enter__()
    _WATCHING.append(watching)


class TestHang:
    def test_a_gang_whose_ranks_all_went_quiet_is_stopped_as_hung(self, net):
        server = net.server(2, hang_timeout=2.0, heartbeat_timeout=2.0)
        a, b = net.join(server, [0, 1])
        through_call([a, b], 0)
        _watching(a, lambda: 30.0)
        _watching(b, lambda: 30.0)
        causes = wait_cause([a, b])
        assert {c.kind for c in causes} == {CauseKind.HANG}
        assert "no output from any rank for" in causes[0].summary and "(hang_timeout=2s)" in causes[0].summary
        assert causes[0].call == 0 and causes[0].node_index is None

    def test_one_node_still_talking_keeps_the_gang_alive(self, net):
        server = net.server(2, hang_timeout=2.0, heartbeat_timeout=2.0)
        a, b = net.join(server, [0, 1])
        through_call([a, b], 0)
        _watching(a, lambda: 30.0)
        _watching(b, lambda: 0.0)
        assert not wait_until(lambda: server.cause is not None, 3.5), server.cause

    def test_a_node_done_with_the_call_does_not_count(self, net):
        server = net.server(2, hang_timeout=2.0, heartbeat_timeout=2.0)
        a, b = net.join(server, [0, 1])
        through_call([a, b], 0)
        a.call_done(0, None, node_report())
        _watching(a, lambda: 0.0)  # would keep the gang alive if it counted
        _watching(b, lambda: 30.0)
        (cause,) = wait_cause([b])
        assert cause.kind is CauseKind.HANG

    def test_off_by_default_and_never_outside_a_call(self, net):
        server = net.server(2, heartbeat_timeout=2.0)
        a, b = net.join(server, [0, 1])
        through_call([a, b], 0)
        _watching(a, lambda: 1e6)
        _watching(b, lambda: 1e6)
        hung = net.server(2, hang_timeout=2.0, heartbeat_timeout=2.0)
        c, d = net.join(hung, [0, 1])  # joined, in no call
        assert not wait_until(lambda: server.cause is not None or hung.cause is not None, 3.0)


# -- stacks: where each node's ranks were, to the control ------------------------------


class TestStacks:
    def test_each_nodes_stacks_reach_the_control_once(self, net):
        server = net.server(2)
        a, b = net.join(server, [0, 1])
        through_call([a, b], 0)
        assert server.stacks_pending(0) == [0, 1]
        b.report_failure(Cause(CauseKind.RANK_FAILED, "boom"), call=0)
        wait_cause([a, b])
        b.send_stacks(0, {})
        a.send_stacks(0, {0: "Current thread 0x1:\n  File \"t.py\", line 3 in f\n", 1: "x"},
                      {0: FlightSummary(OK, (FlightGroup("0", 5, "all_reduce", False),), 5)})
        assert wait_until(lambda: server.stacks_pending(0) == [], GUARD)
        assert server.call_view(0).flights == {0: {0: FlightSummary(OK, (FlightGroup("0", 5, "all_reduce", False),),
                                                                    5)}, 1: {}}
        assert server.handlers.book.calls[0].stacks == {
            0: {0: "Current thread 0x1:\n  File \"t.py\", line 3 in f\n", 1: "x"}, 1: {}}

    def test_a_node_that_left_may_still_send_them(self, net):
        server = net.server(2)
        a, b = net.join(server, [0, 1])
        through_call([a, b], 0)
        b.leave(1, ok=False)
        b.send_stacks(0, {2: "late"})
        assert wait_until(lambda: 1 in server.handlers.book.calls[0].stacks, GUARD)

    def test_a_disconnected_node_is_not_waited_for(self, net):
        server = net.server(2)
        a, b = net.join(server, [0, 1])
        through_call([a, b], 0)
        b.close()
        assert wait_until(lambda: server.stacks_pending(0) == [0], GUARD)

    def test_stacks_too_big_for_a_line_are_cut_not_lost(self, net):
        server = net.server(2)
        a, b = net.join(server, [0, 1])
        through_call([a, b], 0)
        b.send_stacks(0, {r: "y" * 16000 for r in range(200)})
        assert wait_until(lambda: 1 in server.handlers.book.calls[0].stacks, GUARD)
        assert server.cause is None and 0 < len(server.handlers.book.calls[0].stacks[1]) <= 200

    def test_stacks_sent_twice_or_malformed(self, net):
        server = net.server(2)
        (a,) = net.join(server, [0])
        raw = net.raw(server.port)
        raw.hello(server.config, 1)
        a_t, _ = enter_in_background(a, 0)
        raw.send({"type": "call", "index": 0, "entry": "train.py"})
        a_t.join(GUARD)
        good = {"state": "ok", "entries": 2, "groups": [{"name": "0", "entered": 2, "op": "barrier", "done": False}]}
        raw.send({"type": "stacks", "call": 0, "stacks": {"x": 1, "-3": "y", "2": ["no"], "4": "ok"},
                  "flights": {"4": good, "5": {"state": "ok", "groups": [{"entered": -1}]}, "y": good, "6": 7}})
        assert wait_until(lambda: 1 in server.handlers.book.calls[0].stacks, GUARD)
        assert server.handlers.book.calls[0].stacks[1] == {4: "ok"}
        assert list(server.call_view(0).flights[1]) == [4]  # a bad summary is left out, not fatal
        raw.send({"type": "stacks", "call": 0, "stacks": {}})
        (cause,) = wait_cause([a])
        assert (cause.kind, cause.node_index) == (CauseKind.NODE_LOST, 1)


def test_nodes_done_with_the_call_or_gone_owe_no_stacks(net):
    server = net.server(3)
    a, b, c = net.join(server, [0, 1, 2])
    through_call([a, b, c], 0)
    b.call_done(0, None, node_report())
    c.leave(1, ok=False)
    assert wait_until(lambda: server.stacks_pending(0) == [0], GUARD)


# -- cost per node ---------------------------------------------------------------------------


class TestCostPerNode:
    """What the service sends per join and per heartbeat round does not grow
    with the gang: no message lists the nodes, none goes to a node that does
    not need it (issue 24: O(N^2) joins made 1,024 nodes never form)."""

    @staticmethod
    def sent_by_type(monkeypatch):
        from metaflow_extensions.torchrun.plugins.torchrun.gang import peer as peer_mod

        counts: dict = {}
        sizes: list = []
        real = peer_mod.Peer.queue

        def queue(self, data):
            for line in bytes(data).splitlines():
                kind = json.loads(line)["type"]
                counts[kind] = counts.get(kind, 0) + 1
                sizes.append(len(line))
            return real(self, data)

        monkeypatch.setattr(peer_mod.Peer, "queue", queue)
        return counts, sizes

    @pytest.mark.parametrize("nodes", [4, 64])
    def test_a_join_costs_two_small_messages_to_the_joining_node_only(self, net, monkeypatch, nodes):
        counts, sizes = self.sent_by_type(monkeypatch)
        server = net.server(nodes)
        net.join(server, list(range(nodes)))
        assert wait_until(lambda: server.missing() == [], GUARD)
        joins = {k: v for k, v in counts.items() if k != "hb"}
        assert joins == {"challenge": nodes, "welcome": nodes}
        assert max(sizes) < 300  # no message carries a list of nodes

    @pytest.mark.parametrize("nodes", [4, 64])
    def test_a_heartbeat_round_is_one_message_per_node(self, net, monkeypatch, nodes):
        server = net.server(nodes)
        net.join(server, list(range(nodes)))
        assert wait_until(lambda: server.missing() == [], GUARD)
        counts, _ = self.sent_by_type(monkeypatch)
        with server._lock:
            server._heartbeat()
        assert counts == {"hb": nodes}

    def test_the_heartbeat_interval_grows_past_512_nodes_within_the_timeout(self):
        from metaflow_extensions.torchrun.plugins.torchrun.gang.config import GangConfig

        small, big = GangConfig("g", 512), GangConfig("g", 1024)
        assert small.heartbeat_interval == 1.0
        assert big.heartbeat_interval == 2.0
        assert GangConfig("g", 4096).heartbeat_interval == 7.5 == GangConfig("g", 4096).heartbeat_timeout / 4
        assert GangConfig("g", 4096, heartbeat_timeout=8).heartbeat_interval == 2.0

    def test_progress_rides_a_heartbeat_less_often_past_384_nodes(self, monkeypatch):
        """The control parses at most PROGRESS_PER_SECOND progress records a second."""
        from metaflow_extensions.torchrun.plugins.torchrun.base import timeouts
        from metaflow_extensions.torchrun.plugins.torchrun.gang import client
        from metaflow_extensions.torchrun.plugins.torchrun.gang.config import GangConfig

        assert GangConfig("g", 64).progress_send == GangConfig("g", 384).progress_send == timeouts.PROGRESS_SEND
        assert GangConfig("g", 1024).progress_send == 8.0 and GangConfig("g", 4096).progress_send == 32.0
        clock = [100.0]
        monkeypatch.setattr(client.time, "monotonic", lambda: clock[0])
        due, sends = [0.0], 0
        for _ in range(64):  # one heartbeat a second, at 4,096 nodes
            sends += client.paced(lambda: None, due, GangConfig("g", 4096).progress_send) is not None
            clock[0] += 1.0
        assert sends == 2
