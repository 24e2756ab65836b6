"""A host lost mid-training, across three hosts (network namespaces) of two processes each, started as a
JobSet starts its pods, with ``spares=1`` (nodes 0 and 1 train, node 2 waits) or ``min_nodes=2``.

- A host cut off from the network (its link down: its processes live on, nothing reaches its peers, no
  socket closes, as with a NIC gone, a cable pulled or a kernel panic): for good, the gang hears
  nothing from it and takes it out after ``heartbeat_timeout``, the spare trains in its place and the
  step succeeds; for 2 s, inside ``heartbeat_timeout``, the gang rides it out with no restart.
- A host whose processes are all killed (its pod deleted, the machine rebooted): the kernel closes
  every socket, so the gang sees its connection close at once. The test then starts the node's task
  again on it, as Kubernetes' Job re-creates a pod lost to a disruption: with a spare, the spare's host
  takes the lost node's ranks; with ``min_nodes=2``, the two other hosts train on at world size 4 and
  the third grows the gang back. Every task succeeds and the join sees three."""

import json
import os
import time

import pytest

from .harness import FLOWS, PlatformRun, wait_for_step
from .netns import kill_netns

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(300)]

FLOW = os.path.join(FLOWS, "lost_node_flow.py")
SCRIPT_ARGS = ["--steps", "50", "--mb", "2", "--step-sleep", "0.2", "--mark-steps"]
HEARTBEAT = 8  # heartbeat_timeout of the cut tests (the default is 30 s)
START_TIMEOUT = 30  # how long the step waits, from a loss, for the lost node to come back


def _spare_run(sandbox, network, **attrs):
    run = PlatformRun(sandbox, network(3), "kubernetes", FLOW,
                      params=["--nodes", "3", "--script-args", json.dumps(SCRIPT_ARGS)],
                      env={"MFTR_TORCHRUN_ATTRS": json.dumps(dict({"restarts": 2, "spares": 1}, **attrs))})
    run.prepare()
    run.launch_all()
    wait_for_step(sandbox, run, 3)
    return run


def test_a_host_cut_off_for_good_is_replaced_by_the_spare(network, sandbox):
    """Host 1's link goes down mid-training and stays down. Expected: after heartbeat_timeout the control
    takes node 1 out for its silence and brings the spare in, which resumes from the snapshot at the
    world size the gang had; the control and the spare end fine, the step without node 1 once
    start_timeout of the loss has passed, and the join sees two. Node 1, hearing nothing from the control,
    stops its own ranks and its task ends (not fine: it cannot tell that the step went on); what would
    still be left of it is killed at the end, as the machine would be reclaimed."""
    run = _spare_run(sandbox, network, heartbeat_timeout=HEARTBEAT, start_timeout=START_TIMEOUT)
    try:
        cut = time.monotonic()
        run.hosts[1].cut_link()
        for node in (0, 2):
            run.procs[node].wait(timeout=HEARTBEAT + START_TIMEOUT + 120)
        ended = {n: round(time.monotonic() - cut, 1) for n in (0, 2)}
        cut_off_ended = run.procs[1].poll()
    finally:
        kill_netns(run.hosts[1].netns)
        run.hosts[1].restore_link()
    codes = run.wait(30)
    print("node 0 and node 2 ended by %s s after the cut; node 1's task %s" % (
        ended, "had ended (exit %s)" % cut_off_ended if cut_off_ended is not None else "was still running"))
    control = run.node_log(0)
    assert codes[0] == 0 and codes[2] == 0, "exit codes %s\n%s" % (codes, run.logs_summary())
    assert "node 1 (%s) taken out, spare node 2" % run.nodes[1].hostname in control, control[-3000:]
    after = sandbox.reports("start-1-rank-")
    assert sorted(after) == [0, 1, 2, 3] and {after[r]["node"] for r in (2, 3)} == {2}, after
    assert all(s["world"] == 4 and s["from_memory"] for s in after.values()), after
    assert cut_off_ended is not None and codes[1] != 0, "node 1 left running\n%s" % run.logs_summary()
    inputs = run.mapper_tasks()
    found = run.complete({0: 0, 2: 0}, join_artifacts=["count"], inputs=inputs)
    assert found["join"]["count"] == 2, found


def test_a_2s_cut_inside_heartbeat_timeout_is_ridden_out_with_no_restart(network, sandbox):
    """Host 1's link goes down for 2 s mid-training, under heartbeat_timeout=8. Expected: every node ends
    fine with the ranks of their first start, every step done, nothing restarted, nobody taken out."""
    run = _spare_run(sandbox, network, heartbeat_timeout=HEARTBEAT)
    run.hosts[1].cut_link()
    time.sleep(2)  # the cut's length is what this test is about
    run.hosts[1].restore_link()
    codes = run.wait(120)
    assert codes == {0: 0, 1: 0, 2: 0}, "exit codes %s\n%s" % (codes, run.logs_summary())
    assert not sandbox.reports("start-1-rank-"), sandbox.reports("start-1-rank-")  # no second start
    assert "taken out" not in run.node_log(0) and "restart" not in run.node_log(0), run.node_log(0)
    assert {r["step"] for r in sandbox.reports("at-rank-").values()} == {50}, sandbox.reports("at-rank-")
    found = run.complete(codes, join_artifacts=["count"])
    assert found["join"]["count"] == 3, found


@pytest.mark.parametrize("attrs,lost", [({"restarts": 2, "spares": 1}, 1), ({"restarts": 3, "min_nodes": 2}, 2)],
                         ids=["spare", "min_nodes"])
def test_a_killed_host_and_its_return(network, sandbox, attrs, lost):
    run = PlatformRun(sandbox, network(3), "kubernetes", FLOW,
                      params=["--nodes", "3", "--script-args", json.dumps(SCRIPT_ARGS)],
                      env={"MFTR_TORCHRUN_ATTRS": json.dumps(attrs)})
    run.prepare()
    run.launch_all()
    wait_for_step(sandbox, run, 3)
    kill_netns(run.hosts[lost].netns)
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
