"""A worker pod lost on Kubernetes that comes back late, or never, across three hosts (network
namespaces) of two processes each, each node's task run as a JobSet pod runs it.

With ``spares=1``, host 1's processes are all SIGKILLed mid-training (its pod gone with its node) and its
task is not started again while the step runs (no node to put the pod on). The spare trains in its
place; the step ends without it once ``start_timeout`` of the loss has passed, the control saying so,
its record naming the node that never came back, and the join (given the control's list of the step's
tasks, as ``run``'s runtime gives it) sees the two others. Then the Job controller re-creates the pod
after all: its task, started after the step ended, exits 0 at once saying why, where it failed the step
(its Job failed, the JobSet with it) after waiting ``start_timeout`` for a gang that was gone."""

import json
import os
import signal
import time

import pytest

from .harness import FLOWS, PlatformRun
from .netns import netns_pids

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(300)]

FLOW = os.path.join(FLOWS, "lost_node_flow.py")
SCRIPT_ARGS = ["--steps", "30", "--mb", "2", "--step-sleep", "0.2", "--mark-steps"]
START_TIMEOUT = 30  # how long the step waits, from the loss, for the lost node to come back
LATE = "node 1: the gang's step had already ended fine when this task started"


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


def test_a_pod_never_back_ends_the_step_without_it_and_one_back_after_the_step_exits_0(network, sandbox):
    run = PlatformRun(sandbox, network(3), "kubernetes", FLOW,
                      params=["--nodes", "3", "--script-args", json.dumps(SCRIPT_ARGS)],
                      env={"MFTR_TORCHRUN_ATTRS": json.dumps({"restarts": 2, "spares": 1,
                                                              "start_timeout": START_TIMEOUT})})
    run.prepare()
    run.launch_all()
    _wait_for_step(sandbox, run, 3)
    _pull(run.hosts[1])
    lost_at = time.monotonic()
    run.procs[1].wait(timeout=10)
    # The step goes on without node 1 and ends without it: the control waits start_timeout from the loss.
    run.procs[0].wait(timeout=START_TIMEOUT + 120)
    ended_after = time.monotonic() - lost_at
    control = run.node_log(0)
    assert run.procs[0].returncode == 0, run.logs_summary()
    assert "node 1 (%s) lost and not back within start_timeout (30s) of the loss: the step ended without it" \
        % run.nodes[1].hostname in control, control[-3000:]
    print("the control ended %.1f s after the loss (start_timeout %d s)" % (ended_after, START_TIMEOUT))
    # The pod comes back after the step: its task ends fine at once, saying why.
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
