"""The step's record as the task ends: the last call's result, or one made for
an attempt that ran none, with every attempt of the step so far.

The decorator stores it (metadata, artifact, card); what it holds is decided
here, from the session and the ``ThisAttempt`` the decorator kept, so that the
hooks only pass things along.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from . import attempts as attempts_
from . import preflight as preflight_runtime
from .result import METADATA_FIELD, TorchrunResult
from .session import GangSession


@dataclass
class ThisAttempt:
    """What the task knows of its own attempt, beyond the gang's calls."""

    number: int
    started: float = field(default_factory=time.time)
    previous: Optional[attempts_.Previous] = None  # attempt k-1's record (the control, k > 0)
    refusal: Optional[str] = None  # retry_on refused this attempt: why
    resumed_from: Optional[attempts_.Checkpoint] = None  # @checkpoint's load, as the code starts
    code_started: Optional[float] = None

    def read_previous(self, pathspec: str, retry_on: str) -> Optional[str]:
        """Attempt k-1's record: the attempts so far, and whether to run this
        one. Returns a line to say, if any."""
        self.previous, note = attempts_.read_previous(pathspec, self.number - 1, METADATA_FIELD)
        self.refusal = attempts_.refusal(retry_on, self.number, self.previous)
        return note


def step_result(session: Optional[GangSession], attempt: ThisAttempt) -> Optional[TorchrunResult]:
    """The record to keep for this task, None when it has none (no gang)."""
    if session is None:
        return None
    result = session.last_result
    if result is None:
        result = preflight_runtime.refusal_result(session)  # refused before any call
    if session.is_control:
        result = with_attempts(session, result, attempt)
    if result is None:
        return None
    result.preflight = preflight_runtime.record(session) or result.preflight
    return result


def with_attempts(session: GangSession, result: Optional[TorchrunResult], attempt: ThisAttempt) -> TorchrunResult:
    """The control's record, with every attempt of the step so far. An
    attempt that failed before any call (or was refused) gets a record
    too: the next attempt reads why it stopped."""
    refused_for = None
    if attempt.refusal is not None and attempt.previous is not None:
        cause = attempt.previous.cause  # carried: the next attempt refuses too
        refused_for = attempts_.previous_origin(attempt.previous, attempt.number - 1)
    else:
        cause = (result.cause if result is not None else None) or session.cause
    if result is None:
        result = TorchrunResult(
            command=[], node_index=0, num_nodes=session.topology.num_nodes, nproc_per_node="",
            exit_code=None, started_at=attempt.started, ended_at=time.time(), call=-1)
    result.cause = cause
    entry = attempts_.this_attempt(attempt.number, attempt.started, session.results, cause,
                                   attempt.resumed_from, refused_for, attempt.code_started)
    past = attempts_.fill_missing(attempts_.history(attempt.previous), attempt.number)
    result.attempts = attempts_.with_costs(past + [entry])
    return result
