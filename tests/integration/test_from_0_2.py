"""Code written for metaflow-torchrun 0.2, as its authors wrote it, in real flows
(issue 25): TorchrunSingleNodeMultiGPU, None flags, master_port, one message
for every problem, 0.2's value spelling, and 0.1/0.2 calls named."""

import json
import os
import re
import signal
import socket

import pytest
import step_init

from .calls import CallsRun, flow_run, once_per_pytest_run
from .helpers import finish_or_explain, output

pytestmark = pytest.mark.integration


@pytest.fixture
def held_ports():
    """Ports reserved for the test's flow, held for the whole test: each is
    bound (never listening) with SO_REUSEADDR, so no other process's bind or
    outgoing connection can take it meanwhile (a port found free, then closed,
    could be), while the flow's own listeners, which bind with SO_REUSEADDR (the
    gang's service, the rendezvous store), still can."""
    held = []

    def hold():
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        held.append(s)
        return s.getsockname()[1]

    yield hold
    for s in held:
        s.close()


def _finish(proc, timeout=180):
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return out.decode(errors="replace")


def _single(gang, case, timeout=240):
    proc = gang.run(flow="single_node_flow.py", env={"MFTR_SINGLE": case}, timeout=timeout)
    return proc, output(proc)


def _single_result(gang):
    return gang.client("result = Flow('SingleNodeFlow').latest_run['train'].task['result'].data")


def _control_record(gang, flow):
    return gang.client(
        "task = Flow(%r).latest_run['train'].control_task\n"
        "result = json.loads(task.metadata_dict['torchrun-result'])" % flow
    )


# -- 1. TorchrunSingleNodeMultiGPU ----------------------------------------------


@pytest.fixture(scope="module")
def single_calls(tmp_path_factory):
    """The cases "ok" and "positional", two calls in one step of one flow (a flow
    costs about 15 CPU-s), each call's ranks reporting in a folder of its own."""
    kept = once_per_pytest_run(tmp_path_factory, "single-calls", lambda: flow_run(
        tmp_path_factory, "single-calls", flow="single_node_flow.py", env={"MFTR_SINGLE": "ok,positional"}))
    yield CallsRun.from_kept(kept)


def _single_results(gang):
    return gang.client("result = Flow('SingleNodeFlow').latest_run['train'].task['results'].data")


def test_single_node_runs_two_processes_in_an_ordinary_step(single_calls):
    assert single_calls.returncode == 0, single_calls.text[-4000:]
    ranks = single_calls.reports("ok", "rank-")
    assert sorted(ranks) == [0, 1] and {r["world"] for r in ranks.values()} == {2}
    assert {r["sum"] for r in ranks.values()} == {1}  # a real all-reduce
    result = _single_results(single_calls.gang)["ok"]
    assert result["exit_code"] == 0 and result["num_nodes"] == 1 and result["nproc_per_node"] == 2
    assert len(result["ranks"]) == 2


def test_single_node_takes_nproc_from_the_steps_gpus_and_0_2s_order(gang, single_calls):
    proc, text = _single(gang, "derived")
    assert proc.returncode == 0, text
    assert _single_result(gang)["nproc_per_node"] == 2  # @resources(gpu=2)
    # run(torchrun_args, entrypoint, entrypoint_args, nproc): the call "positional" of single_calls.
    assert single_calls.returncode == 0, single_calls.text[-4000:]
    assert {tuple(r["argv"]) for r in single_calls.reports("positional", "rank-").values()} == {("--tag", "p")}
    assert _single_results(single_calls.gang)["positional"]["exit_code"] == 0


def test_single_node_refuses_a_wrong_call_naming_it_not_with_a_type_error(gang):
    # Was Python's TypeError (unexpected keyword argument 'entry_point'): an Internal error.
    proc, text = _single(gang, "typo")
    assert proc.returncode != 0, text
    said = "TorchrunSingleNodeMultiGPU().run does not take entry_point= (did you mean entrypoint=?)"
    assert text.count(said) == 1, text
    assert re.search(r"TorchrunSingleNodeMultiGPU\(\)\.run call 1 \(single_node_flow\.py, line \d+\): ", text), text
    assert "TypeError" not in text and "Internal error" not in text and "Traceback" not in text, text
    assert not gang.reports("rank-")  # refused before any rank started


def test_single_node_failure_names_the_root_cause_with_labelled_logs(gang):
    proc, text = _single(gang, "fail")
    assert proc.returncode != 0, text
    assert re.search(r"First failure: node 0 \([^)]+\), rank 1 \(local rank 1", text) and "ValueError: boom from rank 1" in text, text
    # The rank's traceback is shown once, in the failure; its whole output is in its log.
    assert "Every rank's output, whole:" in text, text
    assert "fail.py\", line" in text


def test_single_node_ctrl_c_leaves_nothing(gang):
    gang.env["MFTR_SINGLE"] = "spin"
    proc = gang.start(flow="single_node_flow.py")
    try:
        gang.wait_for_reports("ready-", 2, timeout=120)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal
        text = finish_or_explain(proc, gang, 90).decode(errors="replace")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, text
    # The gang fixture fails the test if any process of the run is left.


# -- 2. None is a bare flag -------------------------------------------------------


def test_none_values_reach_the_script_as_bare_flags_with_one_line(calls_run):
    # calls.NONE_ARGS, {"lr": 0.1, "resume_ckpt": None, "use_fp16": None}: the one call of the run given a None.
    text = calls_run.text
    assert calls_run.returncode == 0, text[-4000:]
    argvs = calls_run.reports("none", "argv-")
    assert len(argvs) == 4 and all(a == ["--lr", "0.1", "--resume_ckpt", "--use_fp16"] for a in argvs.values())
    assert text.count("None for a bare flag is deprecated") == 1, text  # one line per step


# -- 3. master_port ----------------------------------------------------------------


def test_master_port_in_run_pins_the_rendezvous_port_and_port_the_gangs(gang, held_ports):
    port, service = held_ports(), held_ports()
    proc = gang.run("--torchrun-args", json.dumps({"master_port": port}), "--nproc", "1",
                    env={"MFTR_TORCHRUN_ATTRS": json.dumps({"port": service})}, timeout=240)
    text = output(proc)
    assert proc.returncode == 0, text
    assert text.count("master_port=%d is deprecated" % port) == 1, text
    record = _control_record(gang, "GangFlow")
    assert (record["rdzv_port"], record["gang_port"]) == (port, service)


def test_master_port_in_the_decorators_torchrun_args_pins_the_rendezvous_port(gang, held_ports):
    port = held_ports()
    proc = gang.run(flow="legacy_flow.py", env={"MFTR_LEGACY": "step_master_port", "MFTR_PORT": str(port)},
                    timeout=240)
    text = output(proc)
    assert proc.returncode == 0, text
    assert text.count("master_port=%d is deprecated" % port) == 1, text
    assert gang.client("result = Flow('LegacyFlow').latest_run['join'].task['ports'].data") == [port, port]


# -- 4. one run, every problem -------------------------------------------------------


def test_every_problem_is_named_in_one_message(gang):
    """A real run: the witness that a refusal of @torchrun's step_init reaches
    the console whole, exits non-zero and starts no task. The other refusals at
    the start are checked in this process (tests/step_init.py)."""
    proc = gang.run(flow="legacy_flow.py", env={"MFTR_LEGACY": "problems"}, timeout=120)
    text = output(proc)
    assert proc.returncode != 0, text
    for needle in ("8 problems", "'nprocs'", "(nproc_per_node)=0", "--no-python is set by @torchrun",
                   "['max_restarts'] is ''", "--bogus-option", "@torchrun(port)='x'", "heartbeat_timeout",
                   "@torchrun(args_as)='0.3'"):
        assert needle in text, (needle, text)
    assert "Task is starting" not in text
    assert "Traceback" not in text


def test_an_owned_option_is_named_before_its_empty_value():
    text = step_init.refusal("legacy_flow.py", {"MFTR_LEGACY": "owned"}).text
    assert "--no-python is set by @torchrun" in text and "--nnodes is set by @torchrun" in text, text
    assert "['no_python'] is ''" not in text


# -- 5. True, False and lists as 0.2 spelled them --------------------------------------


def test_a_true_flag_a_script_wants_a_value_for_says_what_0_2_passed(gang):
    proc = gang.run("--script", "bool_arg.py", "--script-args", json.dumps({"bf16": True}), timeout=240)
    text = output(proc)
    assert proc.returncode != 0, text
    assert "argument --bf16: expected one argument" in text, text
    assert "metaflow-torchrun 0.2 passed `--bf16 true`: write 'bf16': 'true'" in text, text


def test_args_as_0_2_spells_values_as_0_2_did(gang):
    args = {"bf16": True, "fp16": False, "sizes": [1, 2], "name": "a b", "resume": None}
    proc = gang.run("--script", "echo_args.py", "--script-args", json.dumps(args),
                    env={"MFTR_TORCHRUN_ATTRS": json.dumps({"args_as": "0.2"})}, timeout=240)
    assert proc.returncode == 0, output(proc)
    expected = ["--bf16", "true", "--fp16", "false", "--sizes", "[1, 2]", "--name", "a b", "--resume"]
    assert all(a == expected for a in gang.reports("argv-").values()), gang.reports("argv-")


# -- 6. 0.1/0.2 calls -----------------------------------------------------------------


@pytest.mark.parametrize(
    "case, needles",
    [
        ("call_master_port", ["does not take master_port= (metaflow-torchrun 0.1/0.2)", "@torchrun(port=N)",
                              "@torchrun(rdzv_port=N)"]),
        ("positional", ["metaflow-torchrun 0.2 took torchrun_args first", "run(entrypoint='scripts/report.py'"]),
    ],
)
def test_0_1_and_0_2_calls_are_named(refusals_run, case, needles):
    # The call refusals.REFUSALS[case], caught in the shared run's step (was legacy_flow.py's, one flow each).
    text = refusals_run.message(case)
    for needle in needles:
        assert needle in text, (needle, text)
    assert "TypeError" not in text


# -- examples/legacy_02: a 0.2 flow as its author wrote it --------------------------


def test_the_0_2_example_runs_unchanged(gang):
    import subprocess
    import sys

    from .helpers import REPO

    flow = os.path.join(REPO, "examples", "legacy_02", "flow.py")
    proc = subprocess.run([sys.executable, flow, "--no-pylint", "run"], cwd=gang.tmp, env=gang.env,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=400)
    text = output(proc)
    assert proc.returncode == 0, text[-4000:]
    written = sorted(os.listdir(gang.out))
    assert written == ["legacy-2-rank-0.txt", "legacy-2-rank-1.txt"] + [
        "legacy-4-rank-%d.txt" % r for r in range(4)], written
    assert "[rank3]: rank 3 of 4 (node 1): hello from 0.2; all-reduce saw 4 ranks" in text, text[-3000:]
    # One line per 0.2 spelling: the two attribute names, then None once per step.
    assert text.count("is deprecated (metaflow-torchrun 0.2)") == 4, text[-3000:]
