"""``current.torch``: what the step's code calls."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional, Union

from .launch.inputs import refuse_legacy_call
from .runtime.single_node import run_plan, say_once
from .launch.command import ArgSpec
from .launch.torch_checks import require_torch
from .errors import TorchrunCallRefused, TorchrunException, TorchrunInvalidArgument
from .host.console import say
from .launch.plan import plan_call
from .runtime.result import TorchrunResult
from .runtime.session import GangSession
from .runtime.preflight import before_first_call
from .runtime.nproc import with_nproc_resolved
from .runtime.torchrun_args import TorchrunArgs, torchrun_args_of


class TorchrunHandle:
    """Published as ``current.torch`` on every node of a ``@torchrun`` step."""

    def __init__(self, session_getter: Callable[[], Optional[GangSession]]):
        self._session = session_getter

    @property
    def last_result(self) -> Optional[TorchrunResult]:
        session = self._session()
        return session.last_result if session is not None else None

    @property
    def torchrun_args(self) -> TorchrunArgs:
        """metaflow-torchrun 0.2's ``nnodes``, ``master_addr``, ``master_port``,
        ``node_rank`` and ``nproc_per_node`` for this node, for code that launches
        torchrun itself (docs/from-0.2.md says what such a launch gets and loses).
        Read-only; the same values for the whole step."""
        session = self._session()
        if session is None:
            raise TorchrunException("current.torch.torchrun_args can only be read in the step's own code.")
        return torchrun_args_of(session)

    def run(
        self,
        entrypoint: Union[str, "os.PathLike[str]", Callable[..., Any]],
        entrypoint_args: ArgSpec = None,
        nproc_per_node: Optional[Union[int, str]] = None,
        torchrun_args: ArgSpec = None,
        **legacy: Any,
    ) -> TorchrunResult:
        """Run ``entrypoint`` (a script path, or a module-level function) under
        torchrun on this node, with every other node of the step; return when all
        of this node's ranks succeeded, raise ``TorchrunFailed`` otherwise (for a
        function, the rank's original exception, caused by ``TorchrunFailed``).
        Every node must make the same calls in the same order."""
        session = self._session()
        call = session.calls_made + 1 if session is not None else 1
        try:
            refuse_legacy_call(entrypoint, entrypoint_args, legacy)  # 0.1/0.2 keywords and order
            require_torch()  # no torch / no torch.distributed / too old: say so now
            if session is None:
                raise TorchrunException("current.torch.run can only be called in the step's own code.")
            search = [os.getcwd()] + ([session.flow_dir] if session.flow_dir else [])
            plan = with_nproc_resolved(plan_call(
                entrypoint, entrypoint_args, nproc_per_node, torchrun_args, session.defaults, search
            ))
        except TorchrunInvalidArgument as e:
            # One message naming the call and the user's line; no traceback of ours.
            raise TorchrunCallRefused(call, caller(), e.message) from None
        before_first_call(session)  # @torchrun(preflight="full"): the collective job, once
        if session.is_control:  # one line per step, not one per node
            say_once(session.identity.gang_id, plan.notes, say)
        return run_plan(session, plan)


def caller(depth: int = 2) -> Optional[str]:
    """``flow.py, line 15``: where the step's code called ``current.torch.run``."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return None
    return "%s, line %d" % (os.path.basename(frame.f_code.co_filename), frame.f_lineno)
