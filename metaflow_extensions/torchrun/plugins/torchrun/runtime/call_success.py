"""A call whose ranks all succeeded on this node: what a function's ranks returned read, the gang told
(with rank 0's pickled value where rank 0 ran here), and on the control every node's end waited for and
rank 0's value taken from the gang once its MAC checked out (gang/calls.py).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Dict

from ..errors import TorchrunInvalidArgument
from ..gang.client import GangClient
from ..gang.messages import NodeReport
from ..launch import CallPlan
from ..procs import functions
from ..record.result import TorchrunResult
from .call_result import CallEnd, ErrorWith


def finish_ok(client: GangClient, plan: CallPlan, index: int, workdir: str, report: NodeReport,
              aborted: ErrorWith) -> CallEnd:
    """This node's ranks are done; the control waits for every node's (``aborted``: the gang stopped instead)."""
    returns: Dict[int, object] = dict(functions.read_returns(workdir)) if plan.function is not None else {}
    rank0 = functions.result_path(workdir, 0)
    client.call_done(index, Path(rank0).read_bytes() if os.path.exists(rank0) else None, report)
    if not client.speaks_for_gang:  # the control reports on the whole gang: every node's end first
        return CallEnd(returns)
    if not client.wait_call_done(index):
        return CallEnd(returns, aborted)
    view = client.call_view(index)
    if plan.function is not None and 0 not in returns:
        if view.rank0 is not None:  # kept only once its MAC checked out (gang/calls.py)
            functions.alias_flow_module()
            returns[0] = pickle.loads(view.rank0)
        elif view.rank0_error:
            problem = view.rank0_error
            return CallEnd(returns, lambda result: unreadable(problem, result))
    return CallEnd(returns)


def unreadable(problem: str, result: TorchrunResult) -> TorchrunInvalidArgument:
    """Rank 0 ran on another node and its return value did not reach the control."""
    return TorchrunInvalidArgument(problem, result=result)
