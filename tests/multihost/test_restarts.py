"""@torchrun(restarts=N) across hosts: a rank SIGKILLed on node 1's host, and
every host's ranks restart in the same tasks on the fresh rendezvous the gang
announced; rank 0 stays on node 0. Two hosts (network namespaces), two
processes each, started as a JobSet starts its pods."""

import json
import os

import pytest

from .harness import FLOWS, PlatformRun

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(300)]

GANG = os.path.join(FLOWS, "gang_flow.py")


def test_a_killed_rank_restarts_every_hosts_ranks_in_the_same_tasks(network, sandbox):
    params = ["--script", "restart_resume.py", "--nproc", "2",
              "--script-args", json.dumps({"fail-at": "0", "steps": 2})]
    run = PlatformRun(sandbox, network(2), "kubernetes", GANG, params=params,
                      env={"MFTR_TORCHRUN_ATTRS": json.dumps({"restarts": 1})})
    run.prepare()
    codes = run.run_nodes(timeout=240)
    assert all(c == 0 for c in codes.values()), "exit codes %s\n%s" % (codes, run.logs_summary())
    with open(os.path.join(sandbox.out, "events.jsonl")) as f:
        events = [json.loads(line) for line in f if line.strip()]
    assert sorted((e["restart"], e["rank"]) for e in events) == [(k, r) for k in (0, 1) for r in range(4)], events
    # Rank 0 on node 0 (the control's host), ranks in node order, before and after the restart.
    assert all(e["node"] == e["group_rank"] == e["rank"] // 2 for e in events), events
    # Each node's ranks ran under one task process, on its own host.
    assert all(len({e["task_pid"] for e in events if e["node"] == n}) == 1 for n in (0, 1)), events
    assert {e["resumed_from"] for e in events if e["restart"] == 1} == {1}, events
    assert len(sandbox.reports("done-")) == 4
    assert "restarting every node's ranks (restart 1 of 1)" in run.node_log(0), run.logs_summary()
