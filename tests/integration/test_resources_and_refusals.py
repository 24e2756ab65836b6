"""nproc_per_node from the step's resources, and misuse refused at flow start.

A flow refused at its start is checked in this process (tests/step_init.py:
Metaflow's graph checks and every step decorator's ``step_init``, as ``run``
calls them), without a real run's subprocess (about 0.5 CPU-s each). The real runs that show such a
refusal reach the console, exit non-zero and start no task are one per kind:
Metaflow's graph check here (missing num_parallel), @torchrun's step_init in
test_from_0_2.py (every problem in one message).
"""

import json

import pytest
import step_init
from our_processes import mentions_torchrun

from .calls import run_calls
from .helpers import output

pytestmark = pytest.mark.integration


def _by_node(reports):
    nodes = {}
    for rep in reports.values():
        nodes.setdefault(rep["node_index"], set()).add(rep["local_rank"])
    return nodes


# Three calls in one step of `--with resources:gpu=2` (calls.py: a flow each cost
# about 15 CPU-s): what decides each call's process count on a GPU step.
GPU_CALLS = [
    {"name": "from_resources", "script": "report.py", "nproc": None},
    {"name": "run_argument", "script": "report.py", "nproc": 1, "torchrun_args": {"nproc_per_node": 3}},
    {"name": "torchrun_args", "script": "report.py", "nproc": None, "torchrun_args": {"nproc-per-node": 1}},
]


@pytest.fixture(scope="module")
def gpu_calls(tmp_path_factory):
    # `--with resources:gpu=2` is attached from the command line.
    yield from run_calls(tmp_path_factory, "gpu-calls", GPU_CALLS, top_args=("--with", "resources:gpu=2"))


def test_resources_gpu_sets_processes_per_node_and_runs_on_cpu(gpu_calls):
    # nproc is not given: 2 processes a node, from the 2 GPUs asked for.
    text = gpu_calls.text
    assert gpu_calls.returncode == 0, text[-4000:]
    reports = gpu_calls.reports("from_resources", "rank-")
    assert sorted(reports) == [0, 1, 2, 3]
    assert _by_node(reports) == {0: {0, 1}, 1: {0, 1}}
    # Said once, naming what was asked for: this call's notice (the others run
    # 1 process a node, and say so in a line of their own).
    assert text.count("no CUDA device is visible on this node; running 2 processes per node") == 1, text[-4000:]
    assert "@resources(gpu=2)" in text


def test_no_accelerator_means_one_process_per_node(calls_run):
    # The call "one_per_node" of calls.CALLS: report.py, nproc_per_node not given.
    assert calls_run.returncode == 0, calls_run.text[-4000:]
    assert _by_node(calls_run.reports("one_per_node", "rank-")) == {0: {0}, 1: {0}}


def test_run_argument_beats_torchrun_args_and_resources(gpu_calls):
    # nproc_per_node=1 in the call, {"nproc_per_node": 3} in its torchrun_args.
    assert gpu_calls.returncode == 0, gpu_calls.text[-4000:]
    assert _by_node(gpu_calls.reports("run_argument", "rank-")) == {0: {0}, 1: {0}}


def test_torchrun_args_beat_resources(gpu_calls):
    # {"nproc-per-node": 1} in the call's torchrun_args, no nproc_per_node.
    assert gpu_calls.returncode == 0, gpu_calls.text[-4000:]
    assert _by_node(gpu_calls.reports("torchrun_args", "rank-")) == {0: {0}, 1: {0}}


REFUSALS = {
    "nproc_zero": "nproc_per_node)=0: nproc_per_node must be at least 1",
    "nproc_negative": "=-2: nproc_per_node must be at least 1",
    "nproc_type": "'many': nproc_per_node must be a positive integer",
    "nproc_float": "1.5 (a float): nproc_per_node must be a positive integer",
    "unknown_attribute": "@torchrun does not take 'nprocs'. It takes: nproc_per_node",
    "unknown_torchrun_option": "unknown torchrun option --max-restart",
    "torchrun_args_type": "must be a list or a dict, not str '--max-restarts 1'",
    "nproc_too_many": "=100000: nproc_per_node must be at most 1024",
    "heartbeat_too_short": "@torchrun(heartbeat_timeout)=0.01: must be at least 2 seconds",
    "retry_on_with_max_restarts": "torchrun_args max_restarts=2: torch's own restart reruns the ranks after any "
                                  "failure, a Python exception in your code too",
    "spares_without_restarts": "@torchrun(spares=1) without restarts: a spare comes in only in an in-step restart",
    "spares_leave_no_node": "@torchrun(spares=2) with num_parallel=2: the gang trains on num_parallel - spares nodes, "
                            "which leaves none. Enter the step with num_parallel=N+2",
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_misuse_is_refused_before_any_task(case):
    # A refusal at the start is a MetaflowException (step_init.start lets any
    # other propagate): Metaflow's CLI prints it without a traceback.
    refused = step_init.refusal("misuse_flow.py", {"MFTR_MISUSE": case})
    assert REFUSALS[case] in refused.text, refused.text


def test_missing_num_parallel_is_refused_with_what_to_do(gang):
    proc = gang.run(flow="no_parallel_flow.py", timeout=120)
    text = output(proc)
    assert proc.returncode != 0, text
    assert "enters it without num_parallel" in text
    assert "self.next(self.train, num_parallel=N)" in text
    assert "Task is starting" not in text


def test_missing_entrypoint_fails_at_once_naming_it(refusals_run):
    # refusals.REFUSALS["missing"], caught in the shared run's step.
    message = refusals_run.message("missing")
    assert "entrypoint 'scripts/no_such_script.py' does not exist" in message
    refusals_run.check_nothing_started()


def test_unusable_argument_type_fails_naming_it(refusals_run):
    # refusals.REFUSALS["dict argument"], caught in the shared run's step.
    message = refusals_run.message("dict argument")
    assert "cannot pass {'nested': 1} (a dict)" in message


BAD_KNOBS = {
    "METAFLOW_TORCHRUN_FLIGHT_RECORDER": ("2k", "METAFLOW_TORCHRUN_FLIGHT_RECORDER='2k': give a whole number of "
                                                "at least 0, or off"),
    "METAFLOW_TORCHRUN_PROGRESS_SECONDS": ("fast", "METAFLOW_TORCHRUN_PROGRESS_SECONDS='fast': give a number of "
                                                   "at least 0.5"),
    "METAFLOW_TORCHRUN_KEEP_LOGS": ("-1", "METAFLOW_TORCHRUN_KEEP_LOGS='-1': give a whole number of at least 0"),
}


def test_knobs_a_reader_would_misread_are_refused_at_flow_start_each_named():
    refused = step_init.refusal("gang_flow.py", {name: value for name, (value, _) in BAD_KNOBS.items()})
    for _, message in BAD_KNOBS.values():
        assert message in refused.text, refused.text


def test_a_knob_only_the_tasks_environment_sets_is_refused_by_the_task(gang):
    """@environment's variables reach the tasks, not the launcher: the first
    task whose environment holds the knob refuses (Metaflow sets up every step's
    decorators in each task), before any rank starts."""
    value, message = BAD_KNOBS["METAFLOW_TORCHRUN_FLIGHT_RECORDER"]
    vars_ = json.dumps({"METAFLOW_TORCHRUN_FLIGHT_RECORDER": value})
    proc = gang.run("--nproc", "1", top_args=("--with", "environment:vars=%s" % vars_), timeout=120)
    text = output(proc)
    assert proc.returncode != 0, text
    assert message in text, text[-3000:]
    assert "Task is starting" in text  # the launcher's own environment is fine
    assert not gang.reports("rank-") and not mentions_torchrun(text)
