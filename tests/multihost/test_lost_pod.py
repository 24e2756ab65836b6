"""A worker pod lost on Kubernetes that comes back late, or never, across three hosts (network
namespaces) of two processes each, each node's task run as a JobSet pod runs it.

With ``spares=1``, host 1's processes are all SIGKILLed mid-training (its pod gone with its node) and its
task is not started again while the step runs (no node to put the pod on). The spare trains in its
place; the step ends without it once ``start_timeout`` of the loss has passed, the control saying so,
its record naming the node that never came back, and the join (given the control's list of the step's
tasks, as ``run``'s runtime gives it) sees the two others. The JobSet of such a step completes with its
control Job (launch/pod_loss.py), so the control's task ends only once node 2's task has stored its
artifacts (held here until the test lets it). Then the Job controller re-creates the pod after all:
its task, started after the step ended, exits 0 at once saying why, where it failed the step (its
Job failed, the JobSet with it) after waiting ``start_timeout`` for a gang that was gone."""

import json
import os
import time

import pytest

from .harness import FLOWS, PlatformRun, wait_for_step
from .netns import kill_netns

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(300)]

FLOW = os.path.join(FLOWS, "lost_node_flow.py")
SCRIPT_ARGS = ["--steps", "30", "--mb", "2", "--step-sleep", "0.2", "--mark-steps"]
START_TIMEOUT = 30  # how long the step waits, from the loss, for the lost node to come back
LATE = "node 1: the gang's step had already ended fine when this task started"


def _until_said(run, node, words, timeout):
    """Until node ``node``'s log has ``words`` (True) or its task ended first (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if words in run.node_log(node):
            return True
        if run.procs[node].poll() is not None:
            return words in run.node_log(node)
        time.sleep(0.1)
    raise AssertionError("node %d said nothing of %r in %ds:\n%s" % (node, words, timeout, run.logs_summary()))


def test_a_pod_never_back_ends_the_step_without_it_and_one_back_after_the_step_exits_0(network, sandbox):
    gate = os.path.join(sandbox.tmp, "node-2-may-store")
    run = PlatformRun(sandbox, network(3), "kubernetes", FLOW,
                      params=["--nodes", "3", "--script-args", json.dumps(SCRIPT_ARGS)],
                      env={"MFTR_TORCHRUN_ATTRS": json.dumps({"restarts": 2, "spares": 1,
                                                              "start_timeout": START_TIMEOUT}),
                           "MFTR_STORE_GATE": "2:" + gate})
    run.prepare()
    run.launch_all()
    try:
        _lose_node_1_for_good(sandbox, run, gate)
    except BaseException:
        run.stop()  # node 2 waits for the gate
        raise
    _the_pod_back_late(run)  # the Job controller re-creates the pod after the step ended


def _lose_node_1_for_good(sandbox, run, gate):
    wait_for_step(sandbox, run, 3)
    kill_netns(run.hosts[1].netns)
    lost_at = time.monotonic()
    run.procs[1].wait(timeout=10)
    # The step goes on without node 1 and ends without it: the control waits start_timeout from the loss,
    # then for node 2's task to store its artifacts (the JobSet would end node 2's Job with the control's).
    waits = _until_said(run, 0, "waiting for node 2's task to store its artifacts", START_TIMEOUT + 120)
    assert waits and run.procs[0].poll() is None, "the control ended before node 2 stored its artifacts\n%s" \
        % run.logs_summary()
    control = run.node_log(0)
    assert "node 1 (%s) lost and not back within start_timeout (30s) of the loss: the step ended without it" \
        % run.nodes[1].hostname in control, control[-3000:]
    open(gate, "w").close()
    run.procs[0].wait(timeout=60)
    ended_after = time.monotonic() - lost_at
    assert run.procs[0].returncode == 0 and _done(sandbox, run, 2), run.logs_summary()
    print("the control ended %.1f s after the loss (start_timeout %d s)" % (ended_after, START_TIMEOUT))


def _the_pod_back_late(run):
    """Its task ends fine at once, saying why; the join, given the control's list, sees nodes 0 and 2."""
    relaunched = time.monotonic()
    run.launch(1)
    codes = run.wait(60)
    late_seconds = time.monotonic() - relaunched
    assert codes == {0: 0, 1: 0, 2: 0}, "exit codes %s\n%s" % (codes, run.logs_summary())
    assert LATE in run.node_log(1), run.node_log(1)[-3000:]
    print("the late task ended %.1f s after it started" % late_seconds)
    # The control's list of the step's tasks leaves node 1 out; the join sees the others.
    inputs = run.mapper_tasks()
    assert inputs == ["%s/train/%s" % (run.run_id, run.nodes[n].task_id) for n in (0, 2)], inputs
    found = run.complete(codes, join_artifacts=["count", "roles"], inputs=inputs)
    assert found["join"]["count"] == 2 and found["join"]["roles"] == {"0": "active", "2": "active"}, found
    record = run.client("result = json.loads(Task(run + '/train/%s').metadata_dict['torchrun-result'])"
                        % run.contract.control_task_id)
    assert record["attempts"][-1]["not_back"] == [1], record["attempts"][-1]


def _done(sandbox, run, node):
    """Node ``node``'s task stored its artifacts (Metaflow's done marker of attempt 0)."""
    task = os.path.join(sandbox.tmp, ".metaflow", run.flow_name, run.run_id, "train", run.nodes[node].task_id)
    return os.path.exists(os.path.join(task, "0.DONE.lock"))
