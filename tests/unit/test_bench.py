"""The bench of @torchrun(spares=K) (gang/bench.py): who trains, who waits,
and what a swap, a blamed host or an unfit node change; every node derives
its torchrun node rank from it, so these are the numbers torchrun gets."""

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.gang import messages as msg
from metaflow_extensions.torchrun.plugins.torchrun.gang.bench import Bench
from metaflow_extensions.torchrun.plugins.torchrun.gang.wire import ProtocolError
from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind


def test_the_last_k_nodes_start_as_spares_and_the_others_are_ranked_in_order():
    bench = Bench.initial(4, 1)
    assert bench.spares == (3,) and bench.out == ()
    assert [bench.node_rank(n) for n in range(4)] == [0, 1, 2, None]
    assert bench.active_count(4) == 3
    assert Bench.initial(3, 0) == Bench() and Bench.initial(2, 2) == Bench()


def test_a_swap_takes_the_node_out_brings_the_first_spare_in_and_renumbers_in_order():
    bench, spare = Bench.initial(5, 2).swap(1)
    assert spare == 3 and bench == Bench((4,), (1,))
    # Node ranks renumbered in node order; global rank 0 stays on node 0.
    assert [bench.node_rank(n) for n in range(5)] == [0, None, 1, 2, None]
    assert [bench.role(n) for n in range(5)] == ["active", "out", "active", "active", "spare"]
    # The bench keeps its size: what travels is K indices whatever the gang's size.
    assert len(bench.benched) == 2
    bench, spare = bench.swap(2)
    assert spare == 4 and bench == Bench((), (1, 2))
    assert [n for n in range(5) if bench.node_rank(n) is not None] == [0, 3, 4]


@pytest.mark.parametrize("node", [0, None, 3])
def test_no_swap_for_node_0_an_unpinned_cause_or_a_benched_node(node):
    assert Bench.initial(4, 1).swap(node) is None


def test_no_swap_once_the_spares_ran_out():
    bench, _ = Bench.initial(3, 1).swap(1)
    assert bench.swap(2) is None


def test_a_blamed_host_starts_as_a_spare_where_a_clean_spare_exists():
    assert Bench.initial(4, 1).prefer([2]) == Bench((2,))
    assert Bench.initial(4, 1).prefer([2, 3]) == Bench((3,))  # no clean spare: as it was
    assert Bench.initial(4, 1).prefer([0]) == Bench((3,))  # node 0 always trains


def test_unfit_nodes_are_taken_out_before_any_rank_starts_where_spares_cover_them():
    assert Bench.initial(4, 1).take_out([1]) == Bench((), (1,))
    assert Bench.initial(4, 1).take_out([3]) == Bench((), (3,))  # an unfit spare is just out
    assert Bench.initial(4, 1).take_out([1, 2]) is None  # one spare for two
    assert Bench.initial(4, 1).take_out([0]) is None
    assert Bench.initial(5, 2).take_out([1, 4]) == Bench((), (1, 4))


def test_go_and_restart_carry_the_bench_and_read_it_back_checked():
    go = msg.Go(2, 29500, Bench((3,), (1,)))
    assert msg.parse(go.to_wire()) == go
    assert "bench" not in msg.Go(2, 29500).to_wire()  # no spares: the message as before
    cause = Cause(CauseKind.RANK_FAILED, "rank 2 killed", node_index=1)
    restart = msg.Restart(0, 1, 29501, cause, Bench((), (1,)), swapped_in=2)
    back = msg.parse(restart.to_wire())
    assert back.bench == Bench((), (1,)) and back.swapped_in == 2 and back.swapped_out == 1


@pytest.mark.parametrize("bench", [
    "x", {"spares": "3"}, {"spares": [0]}, {"spares": [1, 1]}, {"spares": [1], "out": [1]},
    {"spares": [True]}, {"spares": [-1]}, {"spares": list(range(1, 100))},
])
def test_a_hostile_bench_is_refused(bench):
    with pytest.raises(ProtocolError):
        Bench.from_wire(bench)


# -- the service decides the swap and tells every node (real server and clients on 127.0.0.1) -------------------

def _enter(server, clients, index=0):
    from gang_net import enter_everywhere
    enter_everywhere(server, clients, index)


def test_a_failure_pinned_to_a_node_swaps_it_for_the_spare_and_only_the_active_nodes_finish_the_call(net):
    killed = Cause(CauseKind.RANK_FAILED, "rank 2 (node 1) was killed by SIGKILL", node_index=1, rank=2,
                   exit_code=-9, exc_type="killed by signal SIGKILL", call=0)
    server = net.server(3, restarts=1, spares=1)
    clients = net.join(server, [0, 1, 2])
    _enter(server, clients)
    # As the call's launch said: each node's place, worked out as the news came.
    assert [c.seats[(0, 0)].node_rank for c in clients] == [0, 1, None]
    assert {c.seats[(0, 0)].nnodes for c in clients} == {2} and clients[2].seats[(0, 0)].role == "spare"
    # Node 2, the spare, waits; node 1's ranks are killed: node 1 out, node 2 in, on a fresh rendezvous.
    clients[1].report_failure(killed, call=0, restart=0)
    heard = clients[2].news.sit_out(0, 0)
    assert heard is not None and heard.swapped_in == 2 and heard.swapped_out == 1
    assert heard.bench == Bench((), (1,)) and clients[2].seats[(0, 1)].node_rank == 1
    assert clients[1].news.wait_for_restart_or_verdict(0, 0, 5.0) == heard  # each node hears it in its own time
    assert clients[1].seats[(0, 1)].role == "out"
    assert clients[0].news.wait_for_restart_or_verdict(0, 0, 5.0) == heard and server.cause is None
    # Nodes 0 and 2 finish the call: the control and the benched node 1 hear it is over.
    report = msg.NodeReport()
    for c in (clients[0], clients[2]):
        c.call_done(0, None, report)
    assert clients[0].wait_call_done(0)
    assert clients[1].news.sit_out(0, 1) is None and clients[1].news.call_over(0)
    assert server.cause is None


def test_a_failure_on_node_0_restarts_in_place_and_the_spare_stays_one(net):
    from gang_net import GUARD
    on_0 = Cause(CauseKind.RANK_FAILED, "rank 0 (node 0) was killed by SIGKILL", node_index=0, rank=0,
                 exit_code=-9, exc_type="killed by signal SIGKILL", call=0)
    server = net.server(3, restarts=1, spares=1)
    clients = net.join(server, [0, 1, 2])
    _enter(server, clients)
    clients[0].report_failure(on_0, call=0, restart=0)
    decided = clients[1].news.wait_for_restart_or_verdict(0, 0, GUARD)
    assert decided is not None and decided.swapped_in is None and decided.bench == Bench((2,))


def test_a_benched_nodes_empty_stacks_count_once_towards_every_stack_being_in(net):
    # Every node but node 1 has said where its ranks were: the spare (no ranks) sent an empty dump.
    server = net.server(3, restarts=1, spares=1)
    clients = net.join(server, [0, 1, 2])
    _enter(server, clients)
    clients[2].send_stacks(0, {})
    clients[0].send_stacks(0, {0: "Thread 0x1 (most recent call first):\n  File \"train.py\", line 3"})
    assert not clients[0].news.wait_stacks_in(0, 1.0)  # node 1's are still to come
    clients[1].send_stacks(0, {})
    assert clients[0].news.wait_stacks_in(0, 5.0)


def _gang_with_preflight(net, server, prints):
    """Clients that send their preflight on joining, then enter call 0 at once; their ports."""
    import threading
    from gang_net import GUARD
    clients = [net.client(server.config, server.port, n, connect=False,
                          preflight=(lambda p: lambda: msg.Preflight(p))(p)) for n, p in enumerate(prints)]
    ports = {}
    threads = []
    for n, c in enumerate(clients):
        c.connect(give_up_after=GUARD)
        t = threading.Thread(target=lambda n=n, c=c: ports.setdefault(n, c.enter_call(0, "train.py")), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(GUARD)
    return clients, ports


SAME = {"python": "3.11.9", "torch": "2.13.0", "metaflow": "2.19.39", "metaflow_torchrun": "0.3.0"}


def test_a_host_node_history_blames_starts_as_a_spare_where_a_clean_one_exists(net):
    said = []
    server = net.server(3, restarts=1, spares=1, hooks=dict(
        progress=said.append, host_check=lambda hosts: (["node 1: its host failed 2 of the last 5 runs"], None, [1])))
    clients, ports = _gang_with_preflight(net, server, [SAME] * 3)
    assert all(ports[n] is not None for n in range(3)), ports
    # Every node was told the same bench, before any launched: node 1 waits, node 2 trains as node rank 1.
    assert [c.seats[(0, 0)].node_rank for c in clients] == [0, None, 1]
    assert clients[1].seats[(0, 0)].role == "spare" and server.cause is None
    assert any("node 1 (" in line and "starts as a spare" in line for line in said), said


def test_a_blamed_host_under_strict_still_starts_the_gang_when_it_can_sit_out(net):
    from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
    refusal = Cause(CauseKind.PREFLIGHT, "preflight refused the gang: node 1: its host failed", node_index=1)
    server = net.server(3, restarts=1, spares=1, hooks=dict(host_check=lambda hosts: ([], refusal, [1])))
    clients, ports = _gang_with_preflight(net, server, [SAME] * 3)
    assert server.cause is None and all(ports[n] is not None for n in range(3)), (server.cause, ports)
    # Two blamed hosts and one spare: one of them would train, so preflight="strict" refuses as before.
    server = net.server(3, restarts=1, spares=1, hooks=dict(host_check=lambda hosts: ([], refusal, [1, 2])))
    clients, ports = _gang_with_preflight(net, server, [SAME] * 3)
    assert server.cause is not None and server.cause.kind is CauseKind.PREFLIGHT
