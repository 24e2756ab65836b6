"""The gang lives as long as the step: a failure anywhere in a @torchrun step
stops every node within seconds, not only inside current.torch.run.

Each test runs the real 2-node StepFlow (tests/flows/step_flow.py) with one
failure injected and checks the root cause, a bound on the time from the
failure to the end of the run (a hang guard far below the 600 s start timeout
and the 30 s heartbeat timeout that would otherwise end it) and, through the
``gang`` fixture, that no process is left. Latency is printed for the record.
"""

import json
import os
import re
import time

import pytest

from .helpers import without_task_prefix, output

pytestmark = pytest.mark.integration

# From the failure to the end of the run. The requirement is 5 s for the other
# node's step to fail; the bound here also covers Metaflow ending the run, on a
# loaded 2-core CI machine.
BOUND = 20.0


def _run(gang, plan=None, attrs=None, timeout=180, **env):
    extra = {"MFTR_STEP": json.dumps(plan or {}), "MFTR_TORCHRUN_ATTRS": json.dumps(attrs or {})}
    extra.update({k: str(v) for k, v in env.items()})
    started = time.monotonic()
    proc = gang.run(flow="step_flow.py", env=extra, timeout=timeout)
    gang.ended_at = time.time()
    return proc, output(proc), time.monotonic() - started


def _time_to_failure(gang, what):
    """Seconds from the injected failure (the flow notes the time) to the end of
    ``flow.py run``: every node's step has failed and Metaflow has finished."""
    with open(os.path.join(gang.out, "failed-at")) as f:
        took = gang.ended_at - float(f.read())
    print("time to failure (%s): %.2f s" % (what, took))
    return took


def _root_cause(text):
    """The line of a stopped node's error that names the gang's root cause
    (issue 36: no banner; each stopped node's error names it in one line)."""
    lines = [l for l in without_task_prefix(text).splitlines() if re.match(r"node \d+ stopped(: | because)", l)]
    assert lines, text[-4000:]
    return lines[0]


@pytest.mark.parametrize("where", ["before", "between", "after"])
def test_a_worker_raising_in_its_step_stops_the_gang(gang, where):
    proc, text, _ = _run(gang, {"calls": 2, "node": {"1": {"raise": where}}})
    assert proc.returncode != 0
    phrase = {
        "before": "before current.torch.run",
        "between": "after call 1 of current.torch.run",
        "after": "after call 2 of current.torch.run",
    }[where]
    root = _root_cause(text)
    assert "node 1 failed in its step %s: RuntimeError: node 1 gave up %s" % (phrase, where) in root
    # Metaflow prints the step's own exception as for a plain @parallel step: no frame of ours.
    assert "metaflow_extensions/torchrun" not in text, text[-4000:]
    # The other node's step fails with that cause, traceback included.
    assert "node 0 stopped because node 1 failed first" in text
    assert "in _act" in text
    assert _time_to_failure(gang, "node 1 raises %s" % where) < BOUND


def test_the_control_raising_before_run_stops_the_workers(gang):
    proc, text, _ = _run(gang, {"node": {"0": {"raise": "before"}}})
    assert proc.returncode != 0
    assert "node 0 failed in its step before current.torch.run: RuntimeError" in _root_cause(text)
    assert "node 1 stopped because node 0 failed first" in text
    assert _time_to_failure(gang, "control raises before run") < BOUND


def test_a_node_killed_before_run_is_named(gang):
    # Node 1 dies as its step starts, while node 0 goes on to its call.
    proc, text, _ = _run(gang, {"node": {"1": {"kill": "before"}}})
    assert proc.returncode != 0
    assert "node 1 (" in text and "disconnected before its step ended" in _root_cause(text)
    assert _time_to_failure(gang, "node 1 killed before run") < BOUND




def test_a_node_sleeping_before_run_is_interrupted_when_the_other_fails(gang):
    # Node 0 sleeps in its own code (outside current.torch.run) for an hour;
    # node 1 fails: node 0's sleep is interrupted.
    proc, text, took = _run(gang, {"node": {"0": {"sleep": 3600}, "1": {"raise": "before", "sleep": 2}}})
    assert proc.returncode != 0
    assert "node 1 failed in its step before current.torch.run" in _root_cause(text)
    assert "node 0 stopped because node 1 failed first" in text
    assert _time_to_failure(gang, "node 1 raises while node 0 sleeps") < BOUND


def test_several_calls_each_their_own_rendezvous(calls_run):
    # The calls "report_before" and "report" of calls.CALLS: report.py, 2 x 2,
    # one after the other in the one step of every node.
    assert calls_run.returncode == 0, calls_run.text[-4000:]
    for call in ("report_before", "report"):
        reports = calls_run.reports(call, "rank-")
        assert sorted(reports) == [0, 1, 2, 3], (call, reports)
        assert all(r["sum"] == 6 and r["world"] == 4 for r in reports.values())
    for node in (0, 1):
        first, second = calls_run.result("report_before", node), calls_run.result("report", node)
        assert first["succeeded"] and second["succeeded"]
        assert second["call"] == first["call"] + 1 and second["log_dir"] != first["log_dir"]




def test_a_node_making_fewer_calls_is_named(gang):
    proc, text, _ = _run(gang, {"calls": 2, "node": {"0": {"calls": 1}}})
    assert proc.returncode != 0
    assert "node 0 ended its step after 1 call of current.torch.run while node 1 waits in call 2" in (
        _root_cause(text))


def test_a_node_that_never_starts_is_named_after_start_timeout(gang):
    proc, text, _ = _run(gang, attrs={"start_timeout": 8}, MFTR_NEVER_START=1,
                         METAFLOW_TORCHRUN_PROGRESS_SECONDS=2)
    assert proc.returncode != 0
    assert "node 1 did not join within 8s (1 of 2 joined)" in _root_cause(text)
    assert "waiting for nodes: 1/2 joined; node 1 missing for" in text




def test_retry_reruns_promptly_and_meets_nothing_of_the_failed_attempt(gang):
    started = time.monotonic()
    proc, text, wall = _run(gang, {"node": {"1": {"raise": "before", "attempt": 0}}}, MFTR_RETRIES=1)
    assert proc.returncode == 0, text[-4000:]
    print("retried run finished in %.1f s" % wall)
    assert wall < 60
    assert "node 1 gave up before" in text
    reports = gang.reports("a1-c0-rank-")
    assert sorted(reports) == [0, 1] and all(r["sum"] == 1 for r in reports.values())
    assert not gang.reports("a0-c0-rank-")
    assert time.monotonic() - started < 120
