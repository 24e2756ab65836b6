"""A current.torch.run call with a bad argument, with real flows: one message,
once, naming the call and the user's line, with a "did you mean" for a near
miss and no traceback of ours; and nproc_per_node's words resolved to the count
that ran (issue 28, items 5 and 7)."""

from __future__ import annotations

import json
import os
import re

import pytest

from .helpers import check_failure_screen, output
from .refusals import REFUSALS

pytestmark = pytest.mark.integration

FLOW = "call_flow.py"


def _run(gang, call, slow_node=None):
    env = {"MFTR_CALL": json.dumps(call)}
    if slow_node is not None:
        env["MFTR_SLOW_NODE"] = str(slow_node)
    return gang.run(flow=FLOW, env=env, timeout=180)


# (the problem's text said once, the "did you mean"); each call is refusals.REFUSALS[case]
REFUSED = {
    "typo": ("entrypoint 'scripts/reprot.py' does not exist in ", "(did you mean 'report.py'?)"),
    "none": ("entrypoint must be the path of a Python script, not None", None),
    "option": ("unknown torchrun option --max-restart", "(did you mean --max-restarts?)"),
    "print completion": ("torchrun_args: --print-completion cannot be used under @torchrun", None),
    "keyword": ("current.torch.run does not take entrypoint_arg=", "(did you mean entrypoint_args=?)"),
    "no entrypoint": ("current.torch.run does not take entry_point=", "(did you mean entrypoint=?)"),
}
# The call and the user's line, not "before current.torch.run".
NAMED = r"current\.torch\.run call 1 \(refusals_flow\.py, line \d+\): "


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_refused_call_is_said_once_naming_the_call(refusals_run, case):
    """The message; how an uncaught one fails the step is the witness's below."""
    problem, suggestion = REFUSED[case]
    text = refusals_run.message(case)
    assert text.count(problem) == 1, text
    if suggestion:
        assert suggestion in text, text
    assert re.match(NAMED, text), text
    assert "before current.torch.run" not in text
    assert "Traceback" not in text and "plan.py" not in text and "handle.py" not in text, text
    assert "Internal error" not in text and "TypeError" not in text, text
    assert "torch.distributed.run" not in text.replace("python -m torch.distributed.run --help", "")


def test_an_uncaught_refusal_fails_the_step_with_one_screen(gang):
    """The end-to-end witness of test_a_refused_call_is_said_once_naming_the_call
    (its cases share this screen): the refusal once across both nodes, naming
    the call and the user's line, no traceback of ours, no second banner."""
    problem, suggestion = REFUSED["typo"]
    proc = _run(gang, REFUSALS["typo"])
    text = output(proc)
    assert proc.returncode != 0, text
    assert text.count(problem) == 1, text
    assert suggestion in text, text
    assert re.search(r"current\.torch\.run call 1 \(call_flow\.py, line \d+\): ", text), text
    assert "before current.torch.run" not in text
    assert "Traceback" not in text and "plan.py" not in text and "handle.py" not in text, text
    assert "Internal error" not in text and "TypeError" not in text, text
    assert "Root cause" not in text  # the banner would say it a second time
    assert "refused its current.torch.run call (its error is in this log)" in text
    assert "torch.distributed.run" not in text
    check_failure_screen(text, problem, once=problem)
    # A step that never ran a rank has no card worth a line (was: the card's line, above the error).
    assert "card view" not in text, text


def test_a_calls_max_restarts_under_retry_on_infrastructure_is_refused_at_the_call(refusals_run):
    # The step's own torchrun_args max_restarts is refused at step_init (test_resources_and_refusals);
    # a call's was not: torch would have restarted a ValueError the user asked never to retry.
    # The run's step is @torchrun(retry_on="infrastructure").
    text = refusals_run.message("retry_on")
    said = "@torchrun(retry_on='infrastructure') with the call's torchrun_args max_restarts=2: "
    assert text.count(said) == 1 and "Use @torchrun(restarts=2) instead of max_restarts" in text, text
    assert re.match(NAMED, text), text
    assert "Traceback" not in text and "TypeError" not in text, text
    assert not refusals_run.gang.reports("rank-")  # refused before any rank started
    refusals_run.check_nothing_started()


def test_every_mistake_of_a_call_is_named_in_one_message(refusals_run):
    """Was: the unknown keyword alone, and the torchrun option on the next run (issue 52)."""
    text = refusals_run.message("every mistake")
    assert re.match(NAMED + r"2 problems:\n", text), text
    for problem in ("does not take entrypoint_arg= (did you mean entrypoint_args=?)",
                    "unknown torchrun option --max-restart (did you mean --max-restarts?)"):
        assert text.count(problem) == 1, text
    assert "Traceback" not in text and "Internal error" not in text, text


def test_the_other_node_refusing_first_is_still_said_once(gang):
    """Node 0 waits until the gang stops it, so node 1's refusal is the gang's root cause."""
    problem, _ = REFUSED["typo"]
    proc = _run(gang, REFUSALS["typo"], slow_node=0)
    text = output(proc)
    assert proc.returncode != 0, text
    assert text.count(problem) == 1, text
    assert "node 0 stopped because node 1 refused its current.torch.run call" in text


def test_the_searched_directory_is_named_once(refusals_run):
    line = [l for l in refusals_run.message("typo").splitlines() if "does not exist in" in l][0]
    where = line.split("does not exist in ", 1)[1].split(" (did you mean")[0]
    assert where.count(os.sep + "scripts") == 1, line  # was "(looked in: /x, /x)"


def test_nproc_auto_runs_and_records_the_count(calls_run):
    # A rank that imports no torch: the count is the question (4 ranks here).
    # The call "auto" of calls.CALLS: echo_args.py with nproc_per_node="auto".
    text = calls_run.text
    assert calls_run.returncode == 0, text[-4000:]
    cpus = len(os.sched_getaffinity(0))
    assert "nproc_per_node='auto': %d process%s on this node (no CUDA device: one per CPU" % (
        cpus, "" if cpus == 1 else "es") in text, text
    assert text.count("nproc_per_node='auto'") == 1  # once per step, by the control
    assert len(calls_run.reports("auto", "argv-")) == 2 * cpus
    # Each node's result of the call (CallFlow's join kept them as `nprocs`): the number, not "auto".
    assert [calls_run.result("auto", node)["nproc_per_node"] for node in (0, 1)] == [cpus, cpus]
    record = calls_run.result("auto")  # the control's record of the call
    assert record["node_index"] == 0 and record["nproc_per_node"] == cpus


def test_nproc_gpu_on_a_node_without_one_is_refused_naming_it(refusals_run):
    text = refusals_run.message("gpu")
    assert text.count("nproc_per_node='gpu' but this node has no visible CUDA device") == 1, text


def test_a_none_for_a_value_option_is_refused_before_any_agent_starts(refusals_run):
    """Issue 38: torchrun_args={"max_restarts": None} became a bare
    --max-restarts; both nodes started torchrun, which died on its own parser
    (exit 2) and the user read TorchrunFailed. Now it is refused in the step,
    and no torchrun agent starts on either node (every process of the run is
    watched; every call of the run is refused)."""
    text = refusals_run.message("none value")
    refusals_run.check_nothing_started()
    assert text.count("torchrun_args['max_restarts'] is None, but torchrun's --max-restarts takes an "
                      "integer, it is not a flag") == 1, text
    for said in (text, refusals_run.text):
        assert "expected one argument" not in said and "torchrun on node" not in said, said
