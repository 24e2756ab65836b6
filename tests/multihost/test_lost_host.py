"""A host pulled mid-training, across three hosts (network namespaces) of two processes each, started
as a JobSet starts its pods: every process of the host is SIGKILLed, then the test starts the node's
task again on it, the same task as Kubernetes' Job re-creates a pod lost to a disruption. With a
spare, the spare's host takes the lost node's ranks; with ``min_nodes=2``, the two other hosts train
on at world size 4 and the third grows the gang back. Every task succeeds and the join sees three."""

import json
import os
import signal
import time

import pytest

from .harness import FLOWS, PlatformRun
from .netns import netns_pids

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(300)]

FLOW = os.path.join(FLOWS, "lost_node_flow.py")
SCRIPT_ARGS = ["--steps", "50", "--mb", "2", "--step-sleep", "0.2", "--mark-steps"]


def _wait_for_step(sandbox, run, step, timeout=180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        at = sandbox.reports("at-rank-")
        if len(at) >= 4 and all(r["step"] >= step for r in at.values()):
            return
        time.sleep(0.2)
    raise AssertionError("no step %d:\n%s" % (step, run.logs_summary()))


def _pull(host):
    for pid in netns_pids(host.netns):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("attrs,lost", [({"restarts": 2, "spares": 1}, 1), ({"restarts": 3, "min_nodes": 2}, 2)],
                         ids=["spare", "min_nodes"])
def test_a_pulled_host_and_its_return(network, sandbox, attrs, lost):
    run = PlatformRun(sandbox, network(3), "kubernetes", FLOW,
                      params=["--nodes", "3", "--script-args", json.dumps(SCRIPT_ARGS)],
                      env={"MFTR_TORCHRUN_ATTRS": json.dumps(attrs)})
    run.prepare()
    run.launch_all()
    _wait_for_step(sandbox, run, 3)
    _pull(run.hosts[lost])
    run.procs[lost].wait(timeout=10)
    run.launch(lost)  # the pod re-created: the same task, on the same host
    codes = run.wait(240)
    assert all(c == 0 for c in codes.values()), "exit codes %s\n%s" % (codes, run.logs_summary())
    after = sandbox.reports("start-1-rank-")
    if lost == 1:  # the spare's host holds node 1's ranks, at the same world size
        assert sorted(after) == [0, 1, 2, 3] and {after[r]["node"] for r in (2, 3)} == {2}, after
    else:  # two hosts train on, then the third is back in
        assert {s["node"] for s in after.values()} == {0, 1} and {s["world"] for s in after.values()} == {4}, after
        grown = sandbox.reports("start-2-rank-")
        assert sorted(grown) == list(range(6)) and {grown[r]["node"] for r in (4, 5)} == {2}, grown
    assert all(s["from_memory"] for s in after.values()), after
    found = run.complete(codes, join_artifacts=["count", "roles"])
    assert found["join"]["count"] == 3, found
