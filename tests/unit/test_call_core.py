"""The core of a call as the runtime leaves it: the step's context cannot be changed once built,
the error a failed call raises is a pure function of its outcome (runtime/call_error.py), a
result's ``swaps`` is a list as ``active_nodes`` is, and the stored record says itself whether
it was compacted."""

from __future__ import annotations

import dataclasses
import inspect

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.errors import (GangAborted, TorchrunFailed, TorchrunInterrupted,
                                                                   TorchrunNotRetried)
from metaflow_extensions.torchrun.plugins.torchrun.gang.identity import GangIdentity
from metaflow_extensions.torchrun.plugins.torchrun.gang.topology import Topology
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import StepDefaults
from metaflow_extensions.torchrun.plugins.torchrun.procs.failures import RankFailure
from metaflow_extensions.torchrun.plugins.torchrun.record.in_step_restarts import InStepRestart
from metaflow_extensions.torchrun.plugins.torchrun.record.gang_view import GangView
from metaflow_extensions.torchrun.plugins.torchrun.record.result import METADATA_LIMIT, TorchrunResult
from metaflow_extensions.torchrun.plugins.torchrun.runtime.call_error import (CallOutcome, call_error, failing_rank,
                                                                                true_flag_hint)
from metaflow_extensions.torchrun.plugins.torchrun.runtime.context import StepContext


def _context() -> StepContext:
    topology = Topology(num_nodes=2, node_index=1, main_addr="127.0.0.1", ports=(1,), is_local=True)
    return StepContext(GangIdentity("F", "1", "train", "2", 0), StepDefaults(), topology, b"s" * 32)


@pytest.mark.parametrize("name, value", [("topology", None), ("route", ("10.0.0.1", None)), ("warm", None),
                                         ("host_base", "/elsewhere")])
def test_the_steps_context_is_frozen(name, value):
    context = _context()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(context, name, value)


def _failure(rank: int, node: int = 1, message: str = "boom") -> RankFailure:
    return RankFailure(rank=rank, local_rank=rank % 2, node_index=node, host="h", pid=100 + rank, exc_type="ValueError",
                       message=message, traceback="Traceback (most recent call last):\nValueError: %s" % message,
                       timestamp=1.0 + rank)


def _outcome(cause: Cause, **fields) -> CallOutcome:
    return CallOutcome(node_index=1, cause=cause, **fields)


def test_this_nodes_rank_failing_first_raises_torchrun_failed_naming_it():
    cause = Cause(CauseKind.RANK_FAILED, "node 1, rank 3: ValueError: boom", node_index=1, rank=3)
    error = call_error(_outcome(cause, exit_code=1, failures=(_failure(3),), command=("torchrun", "x.py"),
                                elsewhere=(0,)))
    assert type(error) is TorchrunFailed
    assert error.node_index == 1 and error.exit_code == 1 and error.root_cause.rank == 3
    assert error.command == ["torchrun", "x.py"]


def test_a_function_ranks_own_exception_is_raised_as_its_type_and_a_torchrun_failed():
    cause = Cause(CauseKind.RANK_FAILED, "node 1, rank 2: KeyError", node_index=1, rank=2)
    error = call_error(_outcome(cause, exit_code=1, failures=(_failure(2),), rank_exception=KeyError("lr")))
    assert isinstance(error, KeyError) and isinstance(error, TorchrunFailed)


def test_this_node_told_to_stop_raises_interrupted_not_failed():
    cause = Cause(CauseKind.PREEMPTED, "node 1 was told to stop (SIGTERM)", node_index=1, grace=30.0)
    error = call_error(_outcome(cause, exit_code=-15))
    assert type(error) is TorchrunInterrupted and error.message == "node 1 was told to stop (SIGTERM)."


def test_another_node_preempted_or_failing_first_aborts_this_one():
    preempted = Cause(CauseKind.PREEMPTED, "node 0 was told to stop (SIGTERM)", node_index=0, grace=30.0)
    assert type(call_error(_outcome(preempted, exit_code=-15))) is GangAborted
    failed = Cause(CauseKind.RANK_FAILED, "node 0, rank 0: ValueError: boom", node_index=0, rank=0)
    error = call_error(_outcome(failed, exit_code=-15, failures=(_failure(2, message="Connection closed by peer"),)))
    assert type(error) is GangAborted and error.cause is failed
    assert "node 1 stopped because node 0 failed first" in error.message


def test_a_refusal_elsewhere_in_a_shared_log_is_said_once():
    refused = Cause(CauseKind.STEP_FAILED, "node 0 refused current.torch.run call 1: no such file", node_index=0,
                    exc_type="TorchrunCallRefused")
    error = call_error(_outcome(refused, same_log=True))
    assert type(error) is GangAborted
    assert "node 1 stopped because node 0 refused its current.torch.run call" in error.message
    not_retried = Cause(CauseKind.STEP_FAILED, "node 0: not retried", node_index=0,
                        exc_type=TorchrunNotRetried.__name__, message="not retried: a bug")
    assert call_error(_outcome(not_retried)).headline == TorchrunNotRetried.headline


def test_the_control_gone_aborts_with_its_cause():
    gone = Cause(CauseKind.CONTROL_LOST, "lost the connection to the control node (node 0)", node_index=0)
    error = call_error(_outcome(gone, exit_code=-15))
    assert type(error) is GangAborted and "lost the connection to the control node" in error.message


REFUSED_TRUE = "usage: train.py [-h] [--bf16 BF16]\ntrain.py: error: argument --bf16: expected one argument"
HINT = "metaflow-torchrun 0.2 passed `--bf16 true`: write 'bf16': 'true' to keep that"


def test_a_true_flag_a_ranks_argparse_refused_is_hinted_in_the_message_as_it_is_made():
    cause = Cause(CauseKind.RANK_FAILED, "node 1, rank 0: exit code 2", node_index=1, rank=0)
    failure = dataclasses.replace(_failure(0, message="exit code 2"), traceback=REFUSED_TRUE)
    hinted = call_error(_outcome(cause, exit_code=2, failures=(failure,)), true_keys=("bf16",))
    assert type(hinted) is TorchrunFailed and hinted.message.endswith(HINT + ", or @torchrun(args_as=\"0.2\") "
                                                                     "for 0.2's spelling of every value.")
    plain = call_error(_outcome(cause, exit_code=2, failures=(failure,)))
    assert HINT not in plain.message and hinted.message.startswith(plain.message)
    # A key the script took as a flag, or a failure of another kind: no hint.
    assert HINT not in call_error(_outcome(cause, exit_code=2, failures=(failure,)), true_keys=("fp16",)).message
    assert HINT not in call_error(_outcome(cause, exit_code=1, failures=(_failure(0),)), true_keys=("bf16",)).message


def test_another_nodes_refused_true_flag_is_hinted_where_its_cause_shows_it():
    failed = Cause(CauseKind.RANK_FAILED, "node 0, rank 0: exit code 2", node_index=0, rank=0, traceback=REFUSED_TRUE)
    error = call_error(_outcome(failed, exit_code=-15), true_keys=("bf16",))
    assert type(error) is GangAborted and HINT in error.message
    assert true_flag_hint(_outcome(failed), ("bf16",)) in error.message and not true_flag_hint(_outcome(failed), ())


def test_the_rank_named_first_is_the_root_cause_not_an_echo():
    echo = _failure(0, message="Connection closed by peer")
    assert failing_rank([echo, _failure(3)]) == 3 and failing_rank([]) is None


def _result(**fields) -> TorchrunResult:
    return TorchrunResult(command=["torchrun"], node_index=0, num_nodes=3, nproc_per_node=2, exit_code=0,
                          started_at=1.0, ended_at=2.0, **fields)


def test_swaps_is_a_list_as_active_nodes_is():
    restart = InStepRestart(1, Cause(CauseKind.RANK_FAILED, "node 1, rank 2: killed", node_index=1), ran_from=1.0,
                            failed_at=1.5, swapped_out=1, swapped_in=2)
    r = _result(in_step_restarts=[restart], out_nodes=[1])
    assert isinstance(r.swaps, list) and isinstance(r.active_nodes, list)
    assert [(s["out"], s["in"]) for s in r.swaps] == [(1, 2)] and r.active_nodes == [0, 2]
    assert _result().swaps == []


def test_the_stored_record_says_whether_it_was_compacted():
    small = _result().stored()
    assert not small.compacted and small.text == _result().to_json()
    big = _result(gang=GangView(joined_at={n: 1.0 + n for n in range(8192)})).stored()
    assert big.compacted and len(big.text) <= METADATA_LIMIT and '"compacted": true' in big.text


def test_the_results_init_written_by_hand_takes_every_field_as_dataclasses_would():
    # record/result.py writes TorchrunResult's __init__ (import metaflow's cost): a field it forgot fails here.
    params = list(inspect.signature(TorchrunResult).parameters.values())
    fields = dataclasses.fields(TorchrunResult)
    assert [p.name for p in params] == [f.name for f in fields]
    for param, f in zip(params, fields):
        if f.default is not dataclasses.MISSING:
            assert param.default == f.default, f.name
        else:
            assert param.default is (inspect.Parameter.empty if f.default_factory is dataclasses.MISSING else None)
    one, other = _result(), _result()
    assert one.ranks == [] and one.ranks is not other.ranks and one.gang == GangView() and one.returns == {}
    source = _result(role="spare", spare_nodes=[2], call=1, stacks={0: "here"}, log_dir="/l")
    every = {f.name: getattr(source, f.name) for f in fields}
    made = TorchrunResult(**every)
    assert made == source and all(getattr(made, f.name) is getattr(source, f.name) for f in fields)
    assert dataclasses.replace(one, call=1) == _result(call=1) != one
    assert repr(one).startswith("TorchrunResult(command=['torchrun'], node_index=0, num_nodes=3,")


def test_a_hang_before_any_rank_started_says_the_start_counted():
    hang = Cause(CauseKind.HANG, "no output from any rank for 10 s (hang_timeout=10s), in call 1 of current.torch.run")
    early = call_error(_outcome(hang, exit_code=-15, started=False, sees_gang=True))
    assert type(early) is GangAborted and "No rank had started yet" in early.message
    assert early.message.index("hang_timeout=10s") < early.message.index("No rank had started")  # the cause first
    # A worker of a real cluster knows only its own ranks.
    assert "No rank of node 1 had started yet" in call_error(_outcome(hang, exit_code=-15, started=False)).message
    # Ranks that ran (their stacks say where they were), or another cause: no such line.
    assert "No rank had started" not in call_error(_outcome(hang, exit_code=-15)).message
    killed = Cause(CauseKind.NODE_LOST, "node 0 lost", node_index=0)
    assert "No rank had started" not in call_error(_outcome(killed, started=False)).message
