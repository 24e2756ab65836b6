"""The run's record stays readable and small at any gang size (issue 24): the
metadata is bounded, ranks are grouped by where they were, and the full report
keeps every rank."""

from __future__ import annotations

import json

import records
from metaflow_extensions.torchrun.plugins.torchrun.runtime.result import (
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
    from metaflow_extensions.torchrun.plugins.torchrun.runtime import goodput, node_roles
    from metaflow_extensions.torchrun.plugins.torchrun.runtime.attempts import Attempt

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
