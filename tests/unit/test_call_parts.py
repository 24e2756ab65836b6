"""The call's parts (runtime/call.py and the modules it composes): a failed call's error carries its
result from the moment it is made (``err.result``, never set on it afterwards), and a restart or swap
the gang decides is applied in one place (``RestartLoop.apply``) that makes the next start."""

from __future__ import annotations

from types import SimpleNamespace
from typing import List, Optional, Tuple

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.errors import (GangAborted, TorchrunFailed, TorchrunInterrupted,
                                                                   TorchrunInvalidArgument)
from metaflow_extensions.torchrun.plugins.torchrun.gang import messages as msg
from metaflow_extensions.torchrun.plugins.torchrun.gang.bench import Bench
from metaflow_extensions.torchrun.plugins.torchrun.procs.failures import RankFailure
from metaflow_extensions.torchrun.plugins.torchrun.record.result import TorchrunResult
from metaflow_extensions.torchrun.plugins.torchrun.runtime.call_error import CallOutcome, call_error
from metaflow_extensions.torchrun.plugins.torchrun.runtime.call_launch import RanksStart
from metaflow_extensions.torchrun.plugins.torchrun.runtime.call_success import unreadable
from metaflow_extensions.torchrun.plugins.torchrun.runtime.restart_loop import RestartLoop
from metaflow_extensions.torchrun.plugins.torchrun.runtime.restarts import CallRestarts

RESULT = TorchrunResult(["torchrun", "train.py"], 0, 1, 2, 1, 100.0, 130.0)
KILLED = Cause(CauseKind.RANK_FAILED, "node 1, rank 3: killed", node_index=1, rank=3, time=110.0)


def _failure(rank: int) -> RankFailure:
    return RankFailure(rank=rank, local_rank=1, node_index=1, host="h", pid=7, exc_type="KeyError", message="lr",
                       traceback="Traceback (most recent call last):\nKeyError: 'lr'", timestamp=1.0)


@pytest.mark.parametrize("outcome, kind", [
    (CallOutcome(1, KILLED, exit_code=1, failures=(_failure(3),)), TorchrunFailed),
    (CallOutcome(1, KILLED, exit_code=1, failures=(_failure(3),), rank_exception=KeyError("lr")), KeyError),
    (CallOutcome(1, Cause(CauseKind.PREEMPTED, "node 1 was told to stop", node_index=1)), TorchrunInterrupted),
    (CallOutcome(0, KILLED, exit_code=-15), GangAborted),
])
def test_the_error_a_failed_call_raises_carries_its_result_as_made(outcome, kind):
    error = call_error(outcome, RESULT)
    assert isinstance(error, kind) and error.result is RESULT
    assert call_error(outcome).result is None  # nothing attached unless given


def test_rank_zeros_unreadable_value_is_refused_with_the_calls_result():
    error = unreadable("rank 0's return value did not reach the control", RESULT)
    assert isinstance(error, TorchrunInvalidArgument) and error.result is RESULT


class _Launch:
    """What the loop asks of the launch: the one place a start gets its environment."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.log_dir: Optional[str] = None
        self.made: List[Tuple[Optional[object], int, int]] = []

    def rank_starts(self, restart: int) -> List[Optional[float]]:
        return [104.0]

    def start(self, seat, rdzv_port: int, restart: int) -> RanksStart:
        self.made.append((seat, rdzv_port, restart))
        return RanksStart(restart, seat, rdzv_port, ("torchrun",), {"X": "1"})


def _loop(tmp_path, pinned: Optional[int]):
    said: List[str] = []
    seat = Bench.initial(3, 1).seat(2, 3)
    session = SimpleNamespace(context=SimpleNamespace(is_control=False, node_index=0, defaults=SimpleNamespace(restarts=2)))
    client = SimpleNamespace(seats={(0, 1): seat}, hosts=lambda: {})
    failure = SimpleNamespace(new_start=lambda: said.append("new start"), failures=[])
    ranks = SimpleNamespace(started_at=100.0, ended_at=111.0)
    launch, restarts = _Launch(str(tmp_path)), CallRestarts()
    loop = RestartLoop(session, client, SimpleNamespace(rdzv_port=pinned), 0, launch, ranks,  # type: ignore[arg-type]
                       restarts, failure, None)  # type: ignore[arg-type]
    return loop, launch, restarts, said, seat


@pytest.mark.parametrize("pinned, port", [(None, 29511), (29400, 29400)])
def test_a_restart_is_applied_in_one_place_which_makes_the_next_start(tmp_path, pinned, port):
    loop, launch, restarts, said, seat = _loop(tmp_path, pinned)
    start = loop.apply(msg.Restart(0, 1, 29511, KILLED, swapped_in=2))
    assert launch.made == [(seat, port, 1)] and start.restart == 1 and start.rdzv_port == port
    assert restarts.restart == 1 and restarts.records[0].swapped_in == 2 and restarts.records[0].ran_from == 100.0
    assert said == ["new start"] and loop.exit_code is None
