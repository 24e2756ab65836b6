"""The runtime's one entry for a call (``current.torch.run``, 0.2's launcher); a
refused call is one ``TorchrunCallRefused`` naming the user's line, no traceback of ours.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

import dataclasses
import time

from ..errors import TorchrunCallRefused, TorchrunInvalidArgument
from ..gang import node_compare as verdicts
from ..host.console import say, say_once
from ..launch import NO_ACCELERATORS, Accelerators, CallPlan, CallRequest, plan_request
from ..launch.resources import resolved_nproc
from ..record.result import TorchrunResult
from . import preflight
from .call import CallRun, run_call
from .session import GangSession


def run(session: GangSession, request: CallRequest) -> TorchrunResult:
    """One call on this node with every other node of the step; raises unless all its ranks succeeded."""
    flow_dir = session.context.flow_dir
    search = [os.getcwd()] + ([flow_dir] if flow_dir else [])
    try:
        defaults = session.context.defaults
        plan = with_nproc_resolved(plan_request(request, defaults, search), defaults.accelerators)
    except TorchrunInvalidArgument as e:
        raise TorchrunCallRefused(session.calls_made + 1, caller(), e.message, api=request.api) from None
    before_first_call(session)  # @torchrun(preflight="full"): the collective job, once
    if plan.notes and session.context.is_control:  # one line per step, not one per node
        say_once(session.context.notes_key, plan.notes)
    return run_call(session, plan)


def with_nproc_resolved(plan: CallPlan, accelerators: Accelerators = NO_ACCELERATORS) -> CallPlan:
    """``plan`` with this node's whole number of processes (launch/resources.py resolves it)."""
    count, note = resolved_nproc(plan.nproc, accelerators)
    return dataclasses.replace(plan, nproc=count, notes=plan.notes + ((note,) if note else ()))


def before_first_call(session: GangSession) -> None:
    """``preflight="full"``'s collective job (runtime/preflight.py), once per attempt, before the step's first call."""
    plan = preflight.job_plan(session.context.defaults, session.calls_made) if session.job_due else None
    if plan is None:
        return
    began = time.monotonic()
    with session.in_call() as index:
        deadlines = preflight.JobDeadlines(session.context.defaults.heartbeat_timeout,
                                           plan.nproc if isinstance(plan.nproc, int) else 1,
                                           session.context.node_index, index)
        try:
            result = CallRun(session, plan, index, deadlines=deadlines).run()
        except BaseException:
            session.job_ran(None)
            raise
    job = verdicts.job_record(result.returns.get(0), time.monotonic() - began) if session.context.is_control else None
    session.job_ran(job)
    if job is not None:
        assert session.client is not None
        for line in preflight.job_lines(job, session.context.preflight.history, session.client.hosts()):
            say(line)


# metaflow_extensions/torchrun (TorchrunSingleNodeMultiGPU's wrapper included): a frame outside it is the user's.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))) + os.sep


def caller() -> Optional[str]:
    """``flow.py, line 15``: the nearest frame outside this package."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return None
    return "%s, line %d" % (os.path.basename(frame.f_code.co_filename), frame.f_lineno)
