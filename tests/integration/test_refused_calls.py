"""A current.torch.run call with a bad argument, with real flows: one message,
once, naming the call and the user's line, with a "did you mean" for a near
miss and no traceback of ours; and nproc_per_node's words resolved to the count
that ran (issue 28, items 5 and 7)."""

from __future__ import annotations

import json
import os
import re

import pytest
from our_processes import mentions_torchrun

from .helpers import check_failure_screen, output

pytestmark = pytest.mark.integration

FLOW = "call_flow.py"


def _run(gang, call, slow_node=None):
    env = {"MFTR_CALL": json.dumps(call)}
    if slow_node is not None:
        env["MFTR_SLOW_NODE"] = str(slow_node)
    return gang.run(flow=FLOW, env=env, timeout=180)


# (the call's keywords, the problem's text said once, the "did you mean")
REFUSED = {
    "typo": ({"entrypoint": "reprot.py"}, "entrypoint 'scripts/reprot.py' does not exist in ",
             "(did you mean 'report.py'?)"),
    "none": ({"entrypoint": None}, "entrypoint must be the path of a Python script, not None", None),
    "option": ({"entrypoint": "report.py", "torchrun_args": {"max_restart": 2}},
               "unknown torchrun option --max-restart", "(did you mean --max-restarts?)"),
    # torch 2.14+ would print a shell script and exit without a rank; 2.13 has no such option.
    "print completion": ({"entrypoint": "report.py", "torchrun_args": {"print_completion": "bash"}},
                         "torchrun_args: --print-completion cannot be used under @torchrun", None),
    "keyword": ({"entrypoint": "report.py", "entrypoint_arg": {"a": 1}},
                "current.torch.run does not take entrypoint_arg=", "(did you mean entrypoint_args=?)"),
    # Was Python's TypeError (missing 'entrypoint'): an Internal error of 67 lines (issue 52).
    "no entrypoint": ({"entry_point": "report.py"}, "current.torch.run does not take entry_point=",
                      "(did you mean entrypoint=?)"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_refused_call_is_said_once_naming_the_call(gang, case):
    call, problem, suggestion = REFUSED[case]
    proc = _run(gang, call)
    text = output(proc)
    assert proc.returncode != 0, text
    assert text.count(problem) == 1, text
    if suggestion:
        assert suggestion in text, text
    # The call and the user's line, not "before current.torch.run".
    assert re.search(r"current\.torch\.run call 1 \(call_flow\.py, line \d+\): ", text), text
    assert "before current.torch.run" not in text
    assert "Traceback" not in text and "plan.py" not in text and "handle.py" not in text, text
    assert "Internal error" not in text and "TypeError" not in text, text
    assert "Root cause" not in text  # the banner would say it a second time
    assert "refused its current.torch.run call (its error is in this log)" in text
    assert "torch.distributed.run" not in text.replace("python -m torch.distributed.run --help", "")
    check_failure_screen(text, problem, once=problem)


def test_a_calls_max_restarts_under_retry_on_infrastructure_is_refused_at_the_call(gang):
    # The step's own torchrun_args max_restarts is refused at step_init (test_resources_and_refusals);
    # a call's was not: torch would have restarted a ValueError the user asked never to retry.
    gang.env["MFTR_TORCHRUN"] = json.dumps({"retry_on": "infrastructure"})
    proc = _run(gang, {"entrypoint": "report.py", "torchrun_args": {"max_restarts": 2}})
    text = output(proc)
    assert proc.returncode != 0, text
    said = "@torchrun(retry_on='infrastructure') with the call's torchrun_args max_restarts=2: "
    assert text.count(said) == 1 and "Use @torchrun(restarts=2) instead of max_restarts" in text, text
    assert re.search(r"current\.torch\.run call 1 \(call_flow\.py, line \d+\): ", text), text
    assert "Traceback" not in text and "TypeError" not in text, text
    assert not gang.reports("rank-")  # refused before any rank started


def test_every_mistake_of_a_call_is_named_in_one_message(gang):
    """Was: the unknown keyword alone, and the torchrun option on the next run (issue 52)."""
    proc = _run(gang, {"entrypoint": "report.py", "entrypoint_arg": {"a": 1}, "torchrun_args": {"max_restart": 2}})
    text = output(proc)
    assert proc.returncode != 0, text
    assert re.search(r"current\.torch\.run call 1 \(call_flow\.py, line \d+\): 2 problems:\n", text), text
    for problem in ("does not take entrypoint_arg= (did you mean entrypoint_args=?)",
                    "unknown torchrun option --max-restart (did you mean --max-restarts?)"):
        assert text.count(problem) == 1, text
    assert "Traceback" not in text and "Internal error" not in text, text


def test_the_other_node_refusing_first_is_still_said_once(gang):
    """Node 0 waits until the gang stops it, so node 1's refusal is the gang's root cause."""
    call, problem, _ = REFUSED["typo"]
    proc = _run(gang, call, slow_node=0)
    text = output(proc)
    assert proc.returncode != 0, text
    assert text.count(problem) == 1, text
    assert "node 0 stopped because node 1 refused its current.torch.run call" in text


def test_the_searched_directory_is_named_once(gang):
    proc = _run(gang, REFUSED["typo"][0])
    line = [l for l in output(proc).splitlines() if "does not exist in" in l][0]
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


def test_nproc_gpu_on_a_node_without_one_is_refused_naming_it(gang):
    proc = _run(gang, {"entrypoint": "report.py", "nproc_per_node": "gpu"})
    text = output(proc)
    assert proc.returncode != 0, text
    assert text.count("nproc_per_node='gpu' but this node has no visible CUDA device") == 1, text


# Installed in every Python process of the run (PYTHONPATH): each notes its own
# command line and every process it starts, so a test sees what started.
AUDIT = '''
import os, sys
_out = os.environ["MFTR_AUDIT_DIR"]
def _note(kind, text):
    with open(os.path.join(_out, "%d.%s" % (os.getpid(), kind)), "a") as f:
        f.write(text + "\\n")
_note("argv", repr(getattr(sys, "orig_argv", sys.argv)))
def _hook(event, args):
    if event in ("subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.fork"):
        _note("spawn", "%s %r" % (event, args))
sys.addaudithook(_hook)
'''


def test_a_none_for_a_value_option_is_refused_before_any_agent_starts(gang, tmp_path):
    """Issue 38: torchrun_args={"max_restarts": None} became a bare
    --max-restarts; both nodes started torchrun, which died on its own parser
    (exit 2) and the user read TorchrunFailed. Now it is refused in the step,
    and no torchrun agent starts on either node."""
    site, seen = tmp_path / "site", tmp_path / "seen"
    site.mkdir()
    seen.mkdir()
    (site / "sitecustomize.py").write_text(AUDIT)
    call = {"entrypoint": "report.py", "torchrun_args": {"max_restarts": None}}
    proc = gang.run(flow=FLOW, timeout=180, env={
        "MFTR_CALL": json.dumps(call), "MFTR_AUDIT_DIR": str(seen),
        "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)})
    text = output(proc)
    records = {p.name: p.read_text() for p in seen.iterdir()}
    train_tasks = [r for name, r in records.items() if name.endswith(".argv") and "'train'" in r and "'step'" in r]
    assert len(train_tasks) >= 2, records  # both nodes' tasks were watched
    for name, record in records.items():
        assert not mentions_torchrun(record), (name, record)
    assert proc.returncode != 0, text
    assert text.count("torchrun_args['max_restarts'] is None, but torchrun's --max-restarts takes an "
                      "integer, it is not a flag") == 1, text
    assert "expected one argument" not in text and "torchrun on node" not in text, text
