"""@torchrun(spares=1) across hosts (issue 54): three hosts (network
namespaces) of two processes each, started as a JobSet starts its pods; nodes
0 and 1 train, node 2's host waits as the spare. A "bad GPU" on node 1's host
(its ranks SIGKILL themselves after their first step, every time they start
there): node 1 is taken out and node 2's host trains in its place, from the
checkpoint every rank saved, with rank 0 still on node 0's host. Every task
succeeds, the join runs on all three, and each task's record says its role."""

import json
import os

import pytest

from .harness import FLOWS, PlatformRun

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(300)]

GANG = os.path.join(FLOWS, "gang_flow.py")


def test_a_bad_gpu_on_one_host_is_swapped_for_the_spare_host(network, sandbox):
    args = {"fail-at": "", "steps": 3, "bad-node": 1}
    params = ["--script", "restart_resume.py", "--nodes", "3", "--nproc", "2", "--script-args", json.dumps(args)]
    run = PlatformRun(sandbox, network(3), "kubernetes", GANG, params=params,
                      env={"MFTR_TORCHRUN_ATTRS": json.dumps({"restarts": 1, "spares": 1})})
    run.prepare()
    codes = run.run_nodes(timeout=240)
    assert all(c == 0 for c in codes.values()), "exit codes %s\n%s" % (codes, run.logs_summary())
    with open(os.path.join(sandbox.out, "events.jsonl")) as f:
        events = [json.loads(line) for line in f if line.strip()]
    placed = sorted((e["restart"], e["rank"], e["node"], e["group_rank"]) for e in events)
    # Start 0 on nodes 0 and 1; after the swap, nodes 0 and 2 as node ranks 0 and 1.
    assert placed == [(0, 0, 0, 0), (0, 1, 0, 0), (0, 2, 1, 1), (0, 3, 1, 1),
                      (1, 0, 0, 0), (1, 1, 0, 0), (1, 2, 2, 1), (1, 3, 2, 1)], events
    assert {e["world_size"] for e in events} == {4}, events
    assert {e["resumed_from"] for e in events if e["restart"] == 1} == {1}, events
    # Each node's ranks ran under its own task, on its own host.
    assert len({(e["node"], e["task_pid"]) for e in events}) == 3, events
    assert sorted(sandbox.reports("done-")) == [0, 1, 2, 3]
    found = run.complete(codes, join_artifacts=["node_indices"])
    assert found["join"]["node_indices"] == [0, 1, 2], found
    records = run.client(
        "result = {}\n"
        "for t in Step(run + '/train'):\n"
        "    rec = json.loads(t.metadata_dict['torchrun-result'])\n"
        "    result[rec['node_index']] = {'role': rec.get('role'), 'out': rec.get('out_nodes'),\n"
        "                                'spares': rec.get('spare_nodes'), 'restarts': rec['in_step_restarts']}")
    assert {k: r["role"] for k, r in records.items()} == {"0": "active", "1": "out", "2": "active"}, records
    assert all(r["out"] == [1] and r["spares"] == [] for r in records.values()), records
    swap = records["0"]["restarts"]
    assert len(swap) == 1 and swap[0].get("swapped_out") == 1 and swap[0].get("swapped_in") == 2, swap
