"""The runtime's one entry for a call (``current.torch.run``, 0.2's launcher); a
refused call is one ``TorchrunCallRefused`` naming the user's line, no traceback of ours.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

from ..errors import TorchrunCallRefused, TorchrunInvalidArgument
from ..host import say_once
from ..launch import CallRequest, plan_request
from .call import run_call
from .nproc import with_nproc_resolved
from .preflight import before_first_call
from ..record import TorchrunResult
from .session import GangSession


def run(session: GangSession, request: CallRequest) -> TorchrunResult:
    """One call on this node with every other node of the step; raises unless all its ranks succeeded."""
    search = [os.getcwd()] + ([session.flow_dir] if session.flow_dir else [])
    try:
        plan = with_nproc_resolved(plan_request(request, session.defaults, search), session.defaults.accelerators)
    except TorchrunInvalidArgument as e:
        raise TorchrunCallRefused(session.calls_made + 1, caller(), e.message, api=request.api) from None
    before_first_call(session)  # @torchrun(preflight="full"): the collective job, once
    if plan.notes and session.is_control:  # one line per step, not one per node
        say_once(session.notes_key, plan.notes)
    return run_call(session, plan)


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
