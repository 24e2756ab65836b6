"""Where each node's snapshots go and come from: the service's part (gang/snapshot_directory.py) and the
ring it is built on (``Bench.buddy``), checked on the gang's own bench records."""

from __future__ import annotations

from metaflow_extensions.torchrun.plugins.torchrun.gang.bench import Bench
from metaflow_extensions.torchrun.plugins.torchrun.gang.snapshot_directory import on_entered, bench_changed

STORES = {n: ("10.0.0.%d" % n, 40000 + n) for n in range(5)}


def test_the_ring_skips_the_bench_and_wraps_to_node_0():
    bench = Bench.initial(5, 2)  # nodes 3 and 4 are spares
    assert [bench.buddy(n, 5) for n in range(3)] == [1, 2, 0]
    assert [bench.buddied_by(n, 5) for n in range(3)] == [2, 0, 1]
    assert Bench.initial(2, 1).buddy(0, 2) is None  # one node trains: no buddy
    swapped = bench.swap(1)
    assert swapped is not None
    new, spare = swapped
    assert spare == 3 and [new.buddy(n, 5) for n in (0, 2, 3)] == [2, 3, 0]


def test_a_node_entering_learns_its_buddy_and_tells_the_node_before_it():
    bench = Bench.initial(4, 1)
    assert on_entered(0, 0, {0: STORES[0]}, bench, 4) == []  # nobody else is there yet
    told = dict(on_entered(0, 1, {0: STORES[0], 1: STORES[1]}, bench, 4))
    assert told[0].buddy == STORES[1]  # node 0 pushes to node 1
    assert 1 not in told  # node 1's buddy (node 2) has not entered
    told = dict(on_entered(0, 2, {n: STORES[n] for n in range(3)}, bench, 4))
    assert told[2].buddy == STORES[0] and told[1].buddy == STORES[2]
    assert 3 not in told  # the spare sits out: nobody pushes to it


def test_a_swap_tells_the_spare_where_the_replaced_nodes_state_is_and_at_most_three_nodes():
    old = Bench.initial(5, 2)
    new, spare = old.swap(1)  # type: ignore[misc]
    told = dict(bench_changed(0, 1, old, new, 1, spare, STORES, 5))
    assert set(told) <= {0, 2, 3} and spare in told
    # Node 1's shards were pushed to its buddy, node 2: the spare fetches from there.
    assert told[spare].source == STORES[2] and told[spare].source_node == 2
    assert told[spare].buddy == STORES[0] and told[spare].restart == 1
    assert told[0].buddy == STORES[2] and told[0].source is None  # node 0 pushed to node 1, now to node 2
    assert all(m.source is None for n, m in told.items() if n != spare)


def test_a_node_without_a_store_is_never_named():
    old = Bench.initial(3, 1)
    new, spare = old.swap(1)  # type: ignore[misc]
    told = dict(bench_changed(0, 1, old, new, 1, spare, {0: STORES[0], 2: STORES[2]}, 3))
    assert told[spare].source == STORES[0]  # node 1's buddy was node 0
    assert told[0].buddy == STORES[2]


def test_the_steps_lost_count_to_the_newest_step_saved_or_reported():
    from metaflow_extensions.torchrun.plugins.torchrun.runtime.call_snapshots import Resumed

    resumed = Resumed(step=40, source_node=None, newest=40, saved_at=1.0)
    assert resumed.steps_lost() == 0
    assert resumed.steps_lost(reported=47) == 7  # saved every 10 steps: the 7 after the last save are lost
    assert Resumed(40, 2, 45).steps_lost(reported=41) == 5


def test_snapshot_memory_sets_the_budget_and_the_refusal_names_it():
    from metaflow_extensions.torchrun.plugins.torchrun.runtime.call_snapshots import budget_for
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.node import Budget

    def room(share):
        return Budget(int(share * 1000), "%g%% of the room under the container's memory limit" % (share * 100))

    assert budget_for(64.0) == Budget(64 << 20, "@torchrun(snapshot_memory=64)")
    assert budget_for(0.1, room) == Budget(100, "10% of the room under the container's memory limit, as "
                                                "@torchrun(snapshot_memory) sets")
    assert budget_for(None, room).bytes == 250
