"""A node's task lost mid-call (its connection dropped before its step ended): the service takes it out
and the gang goes on where the step allows it (``spares``: a spare in its place; ``min_nodes``: the gang
smaller), the node's new task rejoins as a spare, and the gang grows back once every active node has
saved a snapshot (``regrow``). Real services on 127.0.0.1, nodes played over raw sockets. And the
settings as step_init reads them: every value that cannot work refused, naming the fix."""

from __future__ import annotations

import json
import time

import metaflow  # noqa: F401  (must come before our modules)
import pytest
from gang_net import GUARD, SECRET, new_config, read_line, wait_cause
from proc_helpers import wait_until

from metaflow_extensions.torchrun.plugins.torchrun.cause import CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.errors import Problems, TorchrunInvalidArgument
from metaflow_extensions.torchrun.plugins.torchrun.gang import wire
from metaflow_extensions.torchrun.plugins.torchrun.gang.bench import Bench
from metaflow_extensions.torchrun.plugins.torchrun.launch.inputs import check_min_nodes_fit, validate_min_nodes
from metaflow_extensions.torchrun.plugins.torchrun.spec import ATTRIBUTE_DEFAULTS, read_step_spec, step_defaults

ENTRY = "train.py"


class Node:
    """One node over a raw socket, reading every line the service sends (heartbeats skipped)."""

    def __init__(self, net, server, node):
        self.raw = net.raw(server.port)
        self.buffer = b""
        self.node = node
        welcome = self.raw.hello(server.config, node, host="host-%d" % node)
        assert welcome["type"] == "welcome", welcome

    def send(self, **message):
        self.raw.send(message)

    def next(self, kind, timeout=GUARD):
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                message = json.loads(line)
                if message["type"] == kind:
                    return message
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.raw.sock.settimeout(left)
            try:
                chunk = self.raw.sock.recv(65536)
            except OSError:
                return None
            if not chunk:
                return None
            self.buffer += chunk

    def enter(self, index=0):
        self.send(type="call", index=index, entry=ENTRY)
        return self.next("go")

    def drop(self):
        wire.close_quietly(self.raw.sock)


def _bench(message):
    """(spares, out) as the message's bench says them."""
    bench = message.get("bench") or {}
    return tuple(bench.get("spares") or ()), tuple(bench.get("out") or ())


def _gang(net, nodes=3, **kw):
    server = net.server(config=new_config(nodes, **kw))
    members = [Node(net, server, n) for n in range(nodes)]
    for m in members:
        assert m.enter() is not None
    return server, members


def test_a_lost_node_goes_out_and_a_spare_comes_in(net):
    server, (n0, n1, n2) = _gang(net, restarts=2, spares=1)
    n1.drop()
    restart = n0.next("restart")
    assert restart["restart"] == 1 and restart["swapped_in"] == 2, restart
    assert restart["cause"]["kind"] == "node_lost" and restart["cause"]["node_index"] == 1, restart
    assert restart["cause"]["call"] == 0 and "disconnected before its step ended" in restart["cause"]["summary"]
    assert _bench(restart) == ((), (1,)), restart
    assert server.cause is None


def test_the_lost_node_back_sits_out_as_a_spare_and_the_step_ends_with_it(net):
    server, (n0, n1, n2) = _gang(net, restarts=2, spares=1)
    n1.drop()
    assert n0.next("restart") is not None
    back = Node(net, server, 1)  # its task started again: a new connection, the same proof
    go = back.enter()
    assert _bench(go) == ((1,), ()), go  # a spare now: it sits out
    told = back.next("restart")
    assert told["restart"] == 1 and _bench(told) == ((1,), ()), told
    for member in (n0, n2):
        member.send(type="call_done", index=0)
    assert back.next("call_all_done") is not None
    for member in (n0, back, n2):
        member.send(type="leave", calls=1, ok=True)
    assert n0.next("all_left") is not None
    assert server.cause is None


def test_without_a_spare_min_nodes_lets_the_gang_go_on_smaller_then_grow_back_at_a_snapshot(net):
    server, (n0, n1, n2) = _gang(net, restarts=3, min_nodes=2)
    n2.drop()
    shrunk = n0.next("restart")
    assert shrunk.get("swapped_in") is None and _bench(shrunk) == ((), (2,)), shrunk
    back = Node(net, server, 2)
    back.enter()
    assert back.next("restart")["restart"] == 1
    n0.send(type="hb", saved=1)
    assert n0.next("restart", timeout=0.5) is None  # node 1's ranks have saved nothing in this start yet
    n1.send(type="hb", saved=0)  # a snapshot of the start before: not a restart point
    assert n0.next("restart", timeout=0.5) is None
    n1.send(type="hb", saved=1)
    grown = n0.next("restart")
    assert grown["restart"] == 2 and grown["cause"]["kind"] == "regrown" and _bench(grown) == ((), ()), grown
    assert "node 2 (host-2) back: the gang grows to 3 nodes again" == grown["cause"]["summary"], grown


def test_regrow_false_keeps_the_gang_smaller(net):
    server, (n0, n1, n2) = _gang(net, restarts=3, min_nodes=2, regrow=False)
    n2.drop()
    assert n0.next("restart") is not None
    Node(net, server, 2).enter()
    n0.send(type="hb", saved=1)
    n1.send(type="hb", saved=1)
    assert n0.next("restart", timeout=1.0) is None
    assert server.cause is None


@pytest.mark.parametrize("kw", [dict(restarts=2), dict(restarts=2, min_nodes=3), dict(restarts=0, spares=0)])
def test_with_no_way_to_go_on_a_lost_node_ends_the_gang(net, kw):
    server, (n0, n1, n2) = _gang(net, **kw)
    n1.drop()
    abort = n0.next("abort")
    assert abort["cause"]["kind"] == "node_lost" and abort["cause"]["node_index"] == 1, abort


def test_a_lost_spare_is_taken_off_the_bench_and_the_gang_trains_on(net):
    server, (n0, n1, n2) = _gang(net, restarts=2, spares=1)
    n2.drop()
    assert n0.next("restart", timeout=1.0) is None and n0.next("abort", timeout=0.1) is None
    n1.drop()  # no spare left now, no min_nodes: the end
    assert n0.next("abort")["cause"]["node_index"] == 1


def test_the_bench_loses_readmits_and_regrows():
    bench = Bench.initial(4, 1)  # node 3 a spare
    assert bench.lose(0, 4, None) is None  # node 0 hosts the store
    assert bench.lose(1, 4, None) == (Bench((), (1,)), 3)
    assert Bench((), (1,)).lose(2, 4, None) is None and Bench((), (1,)).lose(2, 4, 2) == (Bench((), (1, 2)), None)
    assert Bench((), (1, 2)).lose(3, 4, 2) is None  # two left: min_nodes=2 allows no fewer
    assert bench.lose(3, 4, None) == (Bench((), (3,)), None)  # the spare itself lost
    assert Bench((), (1, 2)).readmit(2) == Bench((2,), (1,))
    assert Bench((2,), (1,)).regrow(3, 4) == Bench((), (1,)) and Bench((2,), (1,)).regrow(2, 4) == Bench((2,), (1,))


def _read(entries=("3",), decorators=(), **attributes):
    problems = Problems()
    spec = read_step_spec(dict(ATTRIBUTE_DEFAULTS, **attributes), list(decorators), list(entries),
                          ["flow.py", "run"], problems)
    return spec, problems.messages


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "2"])
def test_min_nodes_must_be_a_whole_number_of_nodes(value):
    with pytest.raises(TorchrunInvalidArgument, match=r"min_nodes=.*the fewest nodes that may go on training"):
        validate_min_nodes(value, 2, 0)


def test_min_nodes_is_refused_without_restarts_over_the_nodes_and_on_batch():
    assert _read(min_nodes=2)[1] == [
        "@torchrun(min_nodes=2) without restarts: the gang goes on with fewer nodes in an in-step restart, and "
        "restarts=0 (the default) allows none. Set restarts=N (N >= 1; each loss counts as one of the N), or drop "
        "min_nodes."]
    (said,) = _read(entries=["3"], min_nodes=3, spares=1, restarts=1)[1]
    assert said.startswith("@torchrun(min_nodes=3) with num_parallel=3 and spares=1: the gang trains on 2 nodes"), said
    (said,) = _read(decorators=[("batch", {})], min_nodes=1, restarts=1)[1]
    assert said.startswith("@torchrun(min_nodes=1) with @batch: AWS Batch ends a multi-node job"), said
    with pytest.raises(TorchrunInvalidArgument, match="min_nodes=4"):
        check_min_nodes_fit(4, 0, 3)  # num_parallel known only at the task's start


def test_min_nodes_and_regrow_reach_the_step_defaults():
    spec, said = _read(min_nodes=2, restarts=1, regrow=False)
    defaults = step_defaults(spec)
    assert said == [] and (defaults.min_nodes, defaults.regrow) == (2, False)
    assert step_defaults(_read()[0]).regrow is True and step_defaults(_read()[0]).min_nodes is None


def test_on_aws_batch_a_lost_node_ends_the_gang_even_with_a_spare(net):
    """Batch starts no node again and Metaflow's control then fails the step: better at once than after
    training, when the control has waited 10 minutes for the lost node's task."""
    server, (n0, n1, n2) = _gang(net, restarts=2, spares=1, survives_loss=False)
    n1.drop()
    assert n0.next("abort")["cause"]["kind"] == "node_lost"


def test_the_topology_knows_aws_batch_by_its_job_id():
    from types import SimpleNamespace

    from metaflow_extensions.torchrun.plugins.torchrun.gang.topology import topology_from

    parallel = SimpleNamespace(num_nodes=2, node_index=0, main_ip="10.0.0.1")
    assert topology_from(parallel, {"AWS_BATCH_JOB_ID": "j-1"}, "k").survives_loss is False
    assert topology_from(parallel, {}, "k").survives_loss is True


# -- a node silent past heartbeat_timeout, and a worker told to go (gang/recovery.py decides) -------------

def _silent_gang(net, heartbeat_timeout, **kw):
    """Nodes 0 and 2 real clients (they heartbeat), node 1 played by hand: it says only what the test sends."""
    cut = []
    server = net.server(config=new_config(3, heartbeat_timeout=heartbeat_timeout, restarts=2, **kw),
                        hooks={"on_cut_off": cut.append})
    c0, c2 = net.join(server, [0, 2])
    n1 = Node(net, server, 1)
    n1.send(type="call", index=0, entry=ENTRY)
    from gang_net import enter_everywhere

    enter_everywhere(server, [c0, c2])
    return server, c0, c2, n1, cut


def test_a_silent_node_is_taken_out_as_a_lost_one_told_why_and_refused_after(net):
    server, c0, c2, n1, cut = _silent_gang(net, 1.0, spares=1)
    assert wait_until(lambda: c0.news.restart_after(0, 0) is not None, GUARD + 1.0)
    restart = c0.news.restart_after(0, 0)
    assert restart.swapped_in == 2 and restart.bench.out == (1,), restart
    assert restart.cause.kind is CauseKind.UNRESPONSIVE and restart.cause.node_index == 1
    assert "node 1 (host-1) sent no heartbeat for" in restart.cause.summary and server.cause is None
    assert cut == [1]  # a local control kills its processes
    told = n1.next("abort")  # on its old connection, then closed: a node that wakes hears why and stops
    assert told is not None and told["cause"]["summary"].startswith(
        "node 1 was taken out of the gang, which went on without it: node 1 (host-1) sent no heartbeat"), told
    assert n1.next("heartbeat", timeout=0.5) is None  # closed
    probe = net.raw(server.port)  # its late words on a fresh connection are not its gang's
    probe.read_challenge()
    from metaflow_extensions.torchrun.plugins.torchrun.gang import auth as gang_auth
    probe.send(gang_auth.probe(SECRET, server.config.gang_id, bytes.fromhex(probe.challenge["nonce"]), 1,
                               gang_auth.new_nonce()).to_wire())
    assert read_line(probe.sock)["type"] == "reject"
    back = Node(net, server, 1)  # only a new task comes back: a returning node, a spare
    assert _bench(back.enter()) == ((1,), ()) and server.cause is None


def test_a_silent_node_with_no_way_to_go_on_still_ends_the_gang_naming_it(net):
    server, c0, c2, n1, cut = _silent_gang(net, 1.0)
    (cause,) = wait_cause([c0], GUARD + 1.0)
    assert (cause.kind, cause.node_index) == (CauseKind.UNRESPONSIVE, 1) and cut == [], cause
    assert cause.summary.startswith("node 1 (host-1) sent no heartbeat for"), cause


def test_a_partition_that_heals_inside_heartbeat_timeout_restarts_nothing(net):
    server, c0, c2, n1, cut = _silent_gang(net, 3.0, spares=1)
    time.sleep(1.0)  # a third of heartbeat_timeout without a word
    n1.send(type="hb")
    time.sleep(2.5)  # past heartbeat_timeout since the call began: heard in between, so not silent
    n1.send(type="hb")
    assert c0.news.restart_after(0, 0) is None and server.cause is None and cut == []


def _told(node, what, notice=None):
    from metaflow_extensions.torchrun.plugins.torchrun.runtime.stop import preempted

    return preempted(node, what, 30.0, 30.0, notice, call=0)


@pytest.mark.parametrize("what, notice", [("SIGTERM", None), ("spot", "2030-01-01T00:00:00+00:00")])
def test_a_worker_told_to_go_is_swapped_and_its_later_calls_are_over_at_once(net, what, notice):
    server = net.server(config=new_config(3, restarts=2, spares=1))
    c0, c1, c2 = net.join(server, [0, 1, 2])
    from gang_net import enter_everywhere

    enter_everywhere(server, [c0, c1, c2])
    c1.report_failure(_told(1, what, notice), call=0)
    assert wait_until(lambda: all(c.news.restart_after(0, 0) is not None for c in (c0, c1, c2)), GUARD)
    restart = c1.news.restart_after(0, 0)
    assert restart.swapped_in == 2 and restart.bench.out == (1,) and restart.cause.kind is CauseKind.PREEMPTED
    assert restart.cause.grace == 30.0 and c1.seats[(0, 1)].role == "out"  # every node's grace; node 1 out
    assert c1.enter_call(1, "next.py") is not None and c1.news.wait_call_done(1)  # the step goes on: nothing to wait for
    c1.leave(2, ok=True)  # its step ends while the others are still in call 0: no mismatch, no early leave
    assert wait_until(lambda: 1 in server.handlers.members.left, GUARD)
    time.sleep(0.3)
    assert server.cause is None and c0.cause is None


@pytest.mark.parametrize("what", ["KeyboardInterrupt", "TimeoutException"])
def test_a_worker_told_to_stop_by_ctrl_c_or_timeout_stops_the_gang(net, what):
    server = net.server(config=new_config(3, restarts=2, spares=1))
    c0, c1, c2 = net.join(server, [0, 1, 2])
    from gang_net import enter_everywhere

    enter_everywhere(server, [c0, c1, c2])
    c1.report_failure(_told(1, what), call=0)
    (cause,) = wait_cause([c0])
    assert cause.kind is CauseKind.PREEMPTED and cause.grace == 30.0 and c0.news.restart_after(0, 0) is None
