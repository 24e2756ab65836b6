"""retry_on's decision and the attempts record (record/attempts.py): pure."""

import os

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind, place
from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunInvalidArgument
from metaflow_extensions.torchrun.plugins.torchrun.launch.inputs import validate_retry_on
from metaflow_extensions.torchrun.plugins.torchrun.record import attempts
from metaflow_extensions.torchrun.plugins.torchrun.card.content import attempt_rows
from metaflow_extensions.torchrun.plugins.torchrun.record.result import TorchrunResult

TB = (
    'Traceback (most recent call last):\n'
    '  File "/home/me/project/train.py", line 88, in <module>\n    main()\n'
    '  File "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1, in _call\n'
    '    raise ValueError("bad shape")\nValueError: bad shape\n'
)


def wire(kind, **kw):
    return Cause(kind, kw.pop("summary", "s"), **kw).to_wire()


def previous(record):
    """A previous attempt's record as attempt k reads it (task metadata)."""
    return attempts.Previous.from_wire(record)


def typed(history):
    return [attempts.Attempt.from_wire(a) for a in history]


def test_a_python_exception_of_the_users_code_is_named_with_its_place():
    assert attempts.user_code_failure(Cause(CauseKind.RANK_FAILED, "s", exc_type="ValueError", traceback=TB)) \
        == "ValueError at train.py:88"
    assert attempts.user_code_failure(Cause(CauseKind.STEP_FAILED, "s", exc_type="TypeError", traceback=TB)) \
        == "TypeError at train.py:88"


@pytest.mark.parametrize("cause", [
    wire(CauseKind.NODE_LOST),
    wire(CauseKind.UNRESPONSIVE),
    wire(CauseKind.HANG),
    wire(CauseKind.INTERRUPTED),
    wire(CauseKind.CONTROL_LOST),
    wire(CauseKind.NEVER_JOINED),
    wire(CauseKind.RANK_FAILED, exit_code=-9),  # a signal: no Python exception
    wire(CauseKind.RANK_FAILED, exc_type="RuntimeError", message="[gloo/pair.cc:553] Connection closed by peer"),
    wire(CauseKind.RANK_FAILED, exc_type="DistBackendError", message="NCCL error: unhandled system error"),
    wire(CauseKind.RANK_FAILED, exc_type="torch.distributed.DistNetworkError", message="x"),
    wire(CauseKind.RANK_FAILED, exc_type="ValueError", secondary=True),
    wire(CauseKind.STEP_FAILED, exc_type="GangAborted"),
    # A rank killed by a signal (an OOM kill) or ended by an exit code: no exception of the code.
    wire(CauseKind.RANK_FAILED, exc_type="killed by signal SIGKILL", message="the process ended without a Python exception"),
    None, {}, {"kind": "failed"}, "not a dict", {"kind": "failed", "exc_type": 3},
])
def test_infrastructure_and_unknown_failures_are_retried(cause):
    assert attempts.user_code_failure(Cause.from_wire(cause)) is None
    assert attempts.refusal("infrastructure", 1, previous({"cause": cause})) is None


def test_the_refusal_is_one_line_naming_the_attempt_and_the_place():
    record = {"cause": wire(CauseKind.RANK_FAILED, exc_type="ValueError", traceback=TB)}
    line = attempts.refusal("infrastructure", 1, previous(record))
    assert line == ("attempt 1 ran nothing: attempt 0 failed in your code, ValueError at train.py:88, and "
                    "@torchrun(retry_on='infrastructure') retries only infrastructure failures.")
    assert "\n" not in line and "not retried" not in line  # the error's headline says that, once
    assert attempts.refusal("any", 1, previous(record)) is None
    assert attempts.refusal("infrastructure", 0, previous(record)) is None
    assert attempts.refusal("infrastructure", 1, None) is None  # a task killed leaves no record
    # A refused attempt carries attempt 0's cause: attempt 2 names attempt 0.
    carried = dict(record, attempts=[{"attempt": 0}, {"attempt": 1, "refused_for": 0}])
    assert attempts.refusal("infrastructure", 2, previous(carried)).startswith(
        "attempt 2 ran nothing: attempt 0 failed")


def test_what_metaflow_does_next_is_said_once_in_the_first_refused_attempt():
    """@retry(times=3): Metaflow still starts attempts 2 and 3 (a step cannot
    cancel them); attempt 1 says so, attempts 2 and 3 say only why they ran nothing."""
    record = {"cause": wire(CauseKind.RANK_FAILED, exc_type="ValueError", traceback=TB)}
    carried = dict(record, attempts=[{"attempt": 0}, {"attempt": 1, "refused_for": 0}])
    first = attempts.refusal("infrastructure", 1, previous(record), retries=3)
    assert first.endswith("Metaflow's @retry still starts attempts 2-3, each of which ends here the same way "
                          "before any rank starts (a step cannot cancel Metaflow's retries).")
    assert "starts attempt 2, which ends here" in attempts.refusal("infrastructure", 1, previous(record), retries=2)
    later = [attempts.refusal("infrastructure", k, previous(carried), retries=3) for k in (2, 3)]
    assert all("Metaflow" not in line and line.endswith("infrastructure failures.") for line in later)
    assert "Metaflow" not in attempts.refusal("infrastructure", 1, previous(record), retries=1)  # the last


@pytest.mark.parametrize("value", ["Infrastructure", "all", 1, True, ["any"], ""])
def test_retry_on_takes_two_values(value):
    with pytest.raises(TorchrunInvalidArgument, match="retry_on"):
        validate_retry_on(value)
    assert validate_retry_on(None) == "any"


def test_place_is_the_innermost_frame_of_the_users_code():
    assert place(TB) == "train.py:88"
    assert place('  File "/usr/lib/python3.11/json/decoder.py", line 5, in x\n') == "decoder.py:5"
    assert place(None) is None and place("no frames") is None


def test_what_a_failure_cost_from_the_checkpoint_resumed_from():
    history = [
        {"attempt": 0, "started_at": 100.0, "calls": [{"call": 0, "started_at": 110.0}], "ended_at": 200.0},
        {"attempt": 1, "started_at": 203.0, "calls": [{"call": 0, "started_at": 215.0}],
         "resumed_from": {"created_at": 180.0}, "ended_at": 300.0},
    ]
    out = [a.to_wire() for a in attempts.with_costs(typed(history))]
    assert out[0]["lost_work_seconds"] == 20.0 and out[0]["restart_seconds"] == 15.0
    assert out[0]["lost_seconds"] == 35.0
    assert "lost_seconds" not in out[1]
    # Without a checkpoint, the whole attempt's work since its first call.
    history[1]["resumed_from"] = None
    assert attempts.with_costs(typed(history))[0].lost_work_seconds == 90.0
    # The restart ends when the next attempt's call has its whole gang.
    history[1]["gang_formed_at"] = 230.0
    assert attempts.with_costs(typed(history))[0].restart_seconds == 30.0


def test_an_attempt_without_a_record_is_named_unknown():
    past = attempts.fill_missing(attempts.Previous(None, tuple(typed([{"attempt": 1, "stopped": "x"}]))), 3)
    assert [a.attempt for a in past] == [0, 1, 2]
    assert past[0].stopped.startswith("unknown") and past[1].stopped == "x"


def test_history_ignores_what_is_not_a_list_of_objects():
    assert previous({"attempts": "x"}).attempts == ()
    assert [a.to_wire() for a in attempts.fill_missing(previous({"attempts": [1, {"attempt": 0}]}), 1)] \
        == [attempts.Attempt(0).to_wire()]
    assert [a.stopped[:7] for a in attempts.fill_missing(previous(None), 1)] == ["unknown"]


def test_the_card_shows_every_attempt_once_there_are_two():
    result = TorchrunResult(command=[], node_index=0, num_nodes=2, nproc_per_node=2, exit_code=0,
                            started_at=0.0, ended_at=1.0)
    result.attempts = typed([{"attempt": 0, "started_at": 100.0}])
    assert attempt_rows(result) == []
    result.attempts = attempts.with_costs(typed([
        {"attempt": 0, "started_at": 100.0, "gang_formed_seconds": 2.0,
         "calls": [{"call": 0, "started_at": 104.0}], "ended_at": 150.0, "stopped": "node 1 *lost*"},
        {"attempt": 1, "started_at": 152.0, "calls": [{"call": 0, "started_at": 160.0}],
         "resumed_from": {"created_on": "2026-01-01T00:00:00", "created_at": 140.0, "metadata": {"epoch": 2}},
         "stopped": "succeeded"},
    ]))
    rows = attempt_rows(result)
    assert [r[0] for r in rows] == ["0", "1"]
    # A table cell is drawn as plain text (a backslash escape would show as a
    # backslash): rank-originated text goes in as it is, and stays text.
    assert rows[0][4] == "node 1 *lost*"
    assert "epoch=2" in rows[1][5] and rows[0][6] == "10.0 s" and rows[0][7] == "10.0 s"


def test_the_local_control_task_knows_its_gang_from_its_start(monkeypatch):
    """runtime_step_cli puts MF_PARALLEL_CONTROL_TASK_ID in the local control
    task's environment: @checkpoint reads it in task_pre_step, before Metaflow
    would set it. Not on other nodes (the control passes them its own), not on
    a cluster (Kubernetes and Batch set it)."""
    from types import SimpleNamespace

    from metaflow.unbounded_foreach import UBF_CONTROL, UBF_TASK

    from metaflow_extensions.torchrun.plugins.torchrun.decorator import TorchrunDecorator

    def cli(ubf):
        args = SimpleNamespace(env={}, command_options={},
                               task=SimpleNamespace(task_id="7", ubf_iter=SimpleNamespace(num_parallel=2)))
        TorchrunDecorator().runtime_step_cli(args, 0, 0, ubf)
        return args.env

    from metaflow_extensions.torchrun.plugins.torchrun.runtime.in_runtime import RUNTIME_PID_ENV

    monkeypatch.delenv("METAFLOW_RUNTIME_ENVIRONMENT", raising=False)
    # And the runtime's pid: the local control ends with the runtime that started it.
    assert cli(UBF_CONTROL) == {"MF_PARALLEL_CONTROL_TASK_ID": "7", RUNTIME_PID_ENV: str(os.getpid())}
    assert cli(UBF_TASK) == {}
    monkeypatch.setenv("METAFLOW_RUNTIME_ENVIRONMENT", "kubernetes")
    assert cli(UBF_CONTROL) == {}


def test_the_runtime_starts_one_warm_process_for_the_local_tasks_of_its_run(monkeypatch):
    """runtime_step_cli, for a control task that runs on this host: the run's
    warm process, started once, named in the task's environment, stopped as
    the run finishes. Not for a step with a remote compute decorator, and not
    with METAFLOW_TORCHRUN_WARM_START=0."""
    from types import SimpleNamespace

    from metaflow.unbounded_foreach import UBF_CONTROL

    from metaflow_extensions.torchrun.plugins.torchrun.decorator import TorchrunDecorator
    from metaflow_extensions.torchrun.plugins.torchrun.base.knobs import Knobs
    from metaflow_extensions.torchrun.plugins.torchrun.procs.names import HOST_ZYGOTE_ENV
    from metaflow_extensions.torchrun.plugins.torchrun.runtime import warm_start
    from metaflow_extensions.torchrun.plugins.torchrun.spec import REMOTE_COMPUTE

    def cli(runs_here, knobs=None):
        args = SimpleNamespace(env={}, command_options={},
                               task=SimpleNamespace(task_id="7", ubf_iter=SimpleNamespace(num_parallel=2)))
        deco = TorchrunDecorator()
        deco._spec, deco._knobs = SimpleNamespace(runs_here=runs_here), knobs or Knobs()
        deco.runtime_step_cli(args, 0, 0, UBF_CONTROL)
        return deco, args.env

    monkeypatch.delenv("METAFLOW_RUNTIME_ENVIRONMENT", raising=False)
    assert "kubernetes" in REMOTE_COMPUTE and "batch" in REMOTE_COMPUTE
    assert HOST_ZYGOTE_ENV not in cli(False)[1]
    deco, env = cli(True)
    try:
        first = warm_start._RUNTIME
        assert first is not None and first.pid and env[HOST_ZYGOTE_ENV] == first.path
        assert cli(True)[1][HOST_ZYGOTE_ENV] == first.path and warm_start._RUNTIME is first  # once a run
    finally:
        deco.runtime_finished(None)
    assert warm_start._RUNTIME is None and first.proc is not None and first.proc.poll() is not None
    try:
        assert HOST_ZYGOTE_ENV not in cli(True, Knobs(warm_start=False))[1]
    finally:
        warm_start.close_runtime_warm()

