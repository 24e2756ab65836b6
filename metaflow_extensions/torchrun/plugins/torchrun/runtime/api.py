"""The runtime's one entry for a call: ``run(session, request)``.

Every way of starting a distributed call goes through it: ``current.torch.run``
(``handle.py``) and 0.2's ``TorchrunSingleNodeMultiGPU`` (``single_node.py``).
It goes down once, in order: plan the call (``launch``: every argument checked,
nothing started), turn a process-count word into this node's number, run the
step's preflight job before its first call, then the call itself
(``call.py``). A refused call is one ``TorchrunCallRefused`` naming the call
and the user's line, with no traceback of ours.
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
    """Run one call on this node with every other node of the step; return
    when all of this node's ranks succeeded, raise otherwise."""
    search = [os.getcwd()] + ([session.flow_dir] if session.flow_dir else [])
    try:
        plan = with_nproc_resolved(plan_request(request, session.defaults, search), session.defaults.accelerators)
    except TorchrunInvalidArgument as e:
        site = caller()
        raise TorchrunCallRefused(session.calls_made + 1, site, e.message, api=request.api) from None
    before_first_call(session)  # @torchrun(preflight="full"): the collective job, once
    if plan.notes and session.is_control:  # one line per step, not one per node
        say_once(session.notes_key, plan.notes)
    return run_call(session, plan)


# This extension's directory (metaflow_extensions/torchrun: the plugin and the names
# exported into metaflow, TorchrunSingleNodeMultiGPU's wrapper among them): a frame
# outside it is the user's (or Metaflow's).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))) + os.sep


def caller() -> Optional[str]:
    """``flow.py, line 15``: the nearest frame outside this package, where the
    user's code called one of its public methods."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return None
    return "%s, line %d" % (os.path.basename(frame.f_code.co_filename), frame.f_lineno)
