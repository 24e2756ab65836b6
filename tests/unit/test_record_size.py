"""The run's record stays readable and small at any gang size (issue 24): the
metadata is bounded, ranks are grouped by where they were, and the full report
keeps every rank."""

from __future__ import annotations

import json

import records
from metaflow_extensions.torchrun.plugins.torchrun.record.result import (
    METADATA_LIMIT,
    RankRecord,
    TorchrunResult,
)

DUMP = """Current thread 0x00007f0000000001 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2950 in all_reduce
  File "/work/train.py", line %d in step
"""


def gang_result(nodes: int, per_node: int) -> TorchrunResult:
    reports = {}
    for node in range(nodes):
        ranks = [dict(vars(RankRecord(node * per_node + i, i, pid=1000 + i, start=1.0, end=2.0,
                                      exit_code=1 if node * per_node + i == 17 else 0)))
                 for i in range(per_node)]
        tails = {str(r["rank"]): {"stdout": ["x" * 200] * 20, "stderr": ["y" * 200] * 20} for r in ranks}
        reports[node] = {"ranks": ranks, "tails": tails, "started": 1.0, "ended": 2.0, "truncated": False}
    stacks = {r: DUMP % (77 if r == 17 else 42) for r in range(nodes * per_node)}
    return TorchrunResult(
        command=["torchrun"], node_index=0, num_nodes=nodes, nproc_per_node=per_node, exit_code=1,
        started_at=1.0, ended_at=2.0, cause=records.cause({"kind": "failed", "summary": "rank 17 failed"}),
        gang=records.gang({"joined_at": {n: 1.0 + n / 1000 for n in range(nodes)},
                           "finished_at": {n: 2.0 for n in range(nodes)}, "reports": reports}),
        stacks=stacks,
    )


def test_a_small_gang_keeps_everything_in_the_record():
    result = gang_result(2, 2)
    record = json.loads(result.to_json())
    assert "compacted" not in record
    assert sorted(record["stacks"]) == ["0", "1", "2", "3"]
    assert record["gang"]["reports"]["1"]["tails"]["2"]["stdout"][0] == "x" * 200


def test_8192_ranks_fit_the_metadata_and_name_the_full_report():
    result = gang_result(1024, 8)
    text = result.to_json("artifact torchrun_report of F/1/train/2")
    assert len(text) <= METADATA_LIMIT < 100_000
    record = json.loads(text)
    assert record["compacted"] is True and record["full_report"] == "artifact torchrun_report of F/1/train/2"
    places = record["stack_places"]
    assert (places[0]["ranks"], places[0]["count"]) == ("17", 1)  # the odd one out first
    assert places[0]["place"][0].endswith("train.py:77 in step")
    assert places[1]["count"] == 8191 and places[1]["ranks"] == "0-16, 18-8191"
    node2 = record["gang"]["nodes"]["2"]
    assert node2["ranks"] == 8 and node2["failed"] == [[17, 1]] and node2["failed_count"] == 1
    assert record["gang"]["joined"]["count"] == 1024 and record["gang"]["joined"]["last_node"] == "1023"


def test_the_full_report_keeps_every_rank():
    result = gang_result(1024, 8)
    full = result.to_dict()
    assert len(full["stacks"]) == 8192 and len(full["gang"]["reports"]) == 1024


def test_attempts_of_1024_nodes_fit_keeping_the_nodes_with_a_role():
    from metaflow_extensions.torchrun.plugins.torchrun.record import goodput, node_roles
    from metaflow_extensions.torchrun.plugins.torchrun.record.attempts import Attempt

    hosts = {n: "ip-10-0-%d-%d.ec2.internal" % (n // 256, n % 256) for n in range(1024)}
    result = gang_result(1024, 8)
    for k in range(3):
        nodes, _ = node_roles.entries(1024, hosts, {17 + k: "culprit"}, {}, {n: 10.0 for n in range(1024)}, {})
        result.attempts.append(Attempt(attempt=k, started_at=10.0 * k, ended_at=10.0 * k + 5, nodes=nodes,
                                       stopped="x", recorded_at=10.0 * k + 6))
    result.goodput = goodput.ledger(result.attempts, now=30.0)
    text = result.to_json()
    assert len(text) <= METADATA_LIMIT
    record = json.loads(text)
    assert [[n["node"] for n in a["nodes"]] for a in record["attempts"]] == [[17], [18], [19]]
    assert [a["nodes_left_out"] for a in record["attempts"]] == [1023] * 3
    assert record["goodput"]["wall_seconds"] == 30.0


# -- @torchrun(spares): the swaps and the bench in the record, read back --------------------------------

def _swapped_result(restarts=1, result=None, swap_at=1):
    """The control's result of a call with ``restarts`` in-step restarts, one (``swap_at``) a swap of node 1 for node 2."""
    from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
    from metaflow_extensions.torchrun.plugins.torchrun.record.in_step_restarts import InStepRestart

    killed = Cause(CauseKind.RANK_FAILED, "node 1 (b), rank 2: killed by signal SIGKILL", node_index=1, rank=2)
    found = [InStepRestart(k, killed, ran_from=100.0 + 10 * k, failed_at=105.0 + 10 * k, stopped_at=106.0 + 10 * k,
                           ranks_at=108.0 + 10 * k, work_from=101.0 + 10 * k,
                           swapped_out=1 if k == swap_at else None, swapped_in=2 if k == swap_at else None)
             for k in range(1, restarts + 1)]
    result = result or TorchrunResult(["torchrun"], 0, 3, 1, 0, 100.0, 200.0, call=0)
    result.in_step_restarts = found
    return result


def test_an_attempt_keeps_its_swaps_and_restarts_with_the_hosts_and_reads_them_back():
    from metaflow_extensions.torchrun.plugins.torchrun.cause import CauseKind
    from metaflow_extensions.torchrun.plugins.torchrun.record import attempts

    entry = attempts.this_attempt(0, 90.0, [_swapped_result(restarts=2)], None, None, hosts={0: "a", 1: "b", 2: "c"})
    swap, in_place = entry.restarts
    assert (swap.swapped_out, swap.out_host, swap.swapped_in, swap.in_host) == (1, "b", 2, "c")
    assert swap.swap == "node 1 (b) out, spare node 2 (c) in" and in_place.swap is None
    assert (swap.failed_at, swap.stopped_at, swap.back_at, swap.work_from) == (115.0, 116.0, 118.0, 111.0)
    assert swap.kind is CauseKind.RANK_FAILED and swap.stopped == "node 1 (b), rank 2: killed by signal SIGKILL"
    back = attempts.Attempt.from_wire(json.loads(json.dumps(entry.to_wire())))
    assert back.restarts == entry.restarts and back.restarts_left_out == 0
    # Bounded: the latest ones, and a count of the rest; an older record without the key reads as none.
    many = attempts.this_attempt(0, 90.0, [_swapped_result(restarts=attempts.MAX_RESTART_MARKS + 5)], None, None)
    assert len(many.restarts) == attempts.MAX_RESTART_MARKS and many.restarts_left_out == 5
    assert many.restarts[-1].restart == attempts.MAX_RESTART_MARKS + 5
    old = dict(entry.to_wire())
    del old["restarts"]
    assert attempts.Attempt.from_wire(old).restarts == ()
    junk = dict(entry.to_wire(), restarts=[1, {"call": 0}, {"call": 0, "restart": True, "failed_at": 1.0}, "x"])
    assert attempts.Attempt.from_wire(junk).restarts == ()


def test_the_record_says_the_bench_and_the_swaps_whole_and_reads_back_as_the_next_attempt_and_history_read_it():
    from metaflow_extensions.torchrun.plugins.torchrun.record import attempts, node_history

    def swap(k):
        return {"restart": k, "out": 1, "in": 2, "out_host": "b", "in_host": "c", "failed_at": 105.0 + 10 * k,
                "stopped": "node 1 (b), rank 2: killed by signal SIGKILL"}

    # Compacted: a record keeps the first and the latest 7 of 12 restarts; restart 3, the swap, is in neither.
    for result, compacted, k in ((_swapped_result(), False, 1),
                                 (_swapped_result(restarts=12, result=gang_result(1024, 8), swap_at=3), True, 3)):
        result.role, result.spare_nodes, result.out_nodes = "active", [], [1]
        result.attempts = [attempts.this_attempt(0, 90.0, [result], None, None, hosts={1: "b", 2: "c"})]
        text = result.to_json()
        record = json.loads(text)
        assert len(text) <= METADATA_LIMIT and record.get("compacted", False) is compacted
        assert (record["role"], record["spare_nodes"], record["out_nodes"]) == ("active", [], [1])
        assert record["swaps"] == [swap(k)]  # whole, where a compacted record keeps only some restarts
        assert k == 1 or k not in [r["restart"] for r in record["in_step_restarts"]]
        read = attempts.Previous.from_wire(record)
        assert read is not None and [m.swap for m in read.attempts[0].restarts if m.swap] == [
            "node 1 (b) out, spare node 2 (c) in"]
        assert node_history.record_attempts(text)[0].restarts == read.attempts[0].restarts
    assert result.active_nodes == [0] + list(range(2, 1024)) and "active_nodes" not in record
