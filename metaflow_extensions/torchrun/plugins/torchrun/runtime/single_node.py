"""metaflow-torchrun 0.2's ``TorchrunSingleNodeMultiGPU``, in any step: a
``current.torch.run`` call on a gang of one node, so no second launcher exists.
"""

from __future__ import annotations

import itertools
import os
import sys
from typing import TYPE_CHECKING, Any, List, Mapping, Optional, Tuple

from ..errors import TorchrunException
from ..base import defaults as DEFAULTS
from ..record.result import TorchrunResult  # `import metaflow` exports it too: loaded anyway

if TYPE_CHECKING:  # loaded at the call: `import metaflow` exports this class (0.2's launcher)
    from ..gang import GangIdentity, Topology
    from ..launch import ArgSpec

_sessions = itertools.count()


def step_decorator_specs(flow_name: str, step_name: str) -> List[Tuple[str, Mapping[str, Any]]]:
    """(name, attributes) of the running step's decorators, ``--with``'s included; empty if not found."""
    main = sys.modules.get("__main__")
    for value in list(vars(main).values()) if main is not None else []:
        if isinstance(value, type) and value.__name__ == flow_name:
            func = getattr(value, step_name, None)
            return [(d.name, dict(d.attributes)) for d in getattr(func, "decorators", None) or []]
    return []


def _documented_run(self: Any, torchrun_args: ArgSpec = None, entrypoint: Any = None, entrypoint_args: ArgSpec = None,
                    nproc_per_node: Any = None) -> TorchrunResult:
    """``SingleNodeLauncher.run``'s signature, in 0.2's order, as users write the call."""
    raise NotImplementedError


class SingleNodeLauncher:
    """``TorchrunSingleNodeMultiGPU().run(entrypoint=..., entrypoint_args=...,
    nproc_per_node=N)``: in any step, with or without ``@torchrun``."""

    def __init__(self, args_as: str = "ours", label_logs: bool = True,
                 heartbeat_timeout: float = DEFAULTS.HEARTBEAT_TIMEOUT, start_timeout: float = DEFAULTS.START_TIMEOUT,
                 shutdown_grace: float = DEFAULTS.SHUTDOWN_GRACE) -> None:
        from ..launch import validate_args_as, validate_timeouts

        self._args_as = validate_args_as(args_as, "TorchrunSingleNodeMultiGPU(args_as)")
        validate_timeouts(heartbeat_timeout, start_timeout)
        self._label_logs = bool(label_logs)
        self._heartbeat_timeout = float(heartbeat_timeout)
        self._start_timeout = float(start_timeout)
        self._shutdown_grace = shutdown_grace
        self.last_result: Optional[TorchrunResult] = None

    def run(self, /, *args: Any, **kwargs: Any) -> TorchrunResult:
        """0.2's order: ``run(torchrun_args, entrypoint, entrypoint_args,
        nproc_per_node)``. Runs ``entrypoint`` on this node under torchrun;
        returns the ``TorchrunResult``, raises ``TorchrunFailed`` with the root
        cause when a rank fails. A call that cannot be made (a keyword it does
        not take, no entrypoint) is one ``TorchrunCallRefused`` naming every
        problem, as ``current.torch.run``'s, never a ``TypeError``."""
        from metaflow import current

        from ..gang.secret import make_secret
        from ..launch import StepDefaults, call_request, requested_accelerators, step_timeout, validate_shutdown_grace
        from ..launch.plan import ORDER_0_2
        from . import api as runtime  # the runtime, entered at the call: `import metaflow` exports this class
        from .context import step_context
        from .session import GangSession

        if not current.is_running_flow or current.step_name is None:
            raise TorchrunException("TorchrunSingleNodeMultiGPU().run can only be called in a step's code.")
        request = call_request(args, kwargs, api="TorchrunSingleNodeMultiGPU().run", order=ORDER_0_2)
        specs = step_decorator_specs(current.flow_name, current.step_name)
        accelerators = requested_accelerators(specs)
        defaults = StepDefaults(derived_nproc=accelerators.nproc, accelerators=accelerators, args_as=self._args_as,
                                heartbeat_timeout=self._heartbeat_timeout, start_timeout=self._start_timeout,
                                shutdown_grace=validate_shutdown_grace(self._shutdown_grace, step_timeout(specs)),
                                label_logs=self._label_logs)
        flow_dir = os.path.dirname(os.path.abspath(sys.argv[0]))
        session = GangSession(step_context(self._identity(current), defaults, _one_node(), make_secret(),
                                           flow_dir=flow_dir, notes_key=current.pathspec or ""))
        session.join()
        try:
            result = runtime.run(session, request)
        except BaseException as e:
            session.step_failed(e)
            raise
        else:
            session.step_succeeded()
        finally:
            session.close()
        self.last_result = result
        return result

    # What help() and IDEs show (inspect.signature follows ``__wrapped__``; made at
    # ``import metaflow``, a Signature would cost it a tenth of a millisecond): the call as documented.
    run.__wrapped__ = _documented_run  # type: ignore[attr-defined]

    @staticmethod
    def _identity(current: Any) -> GangIdentity:
        """A gang of its own per call: calls never share a rendezvous id or files."""
        from ..gang import GangIdentity

        return GangIdentity(flow_name=str(current.flow_name), run_id=str(current.run_id),
                            step_name=str(current.step_name), attempt=int(current.retry_count or 0),
                            control_task_id="%s-single%d" % (current.task_id, next(_sessions)))


def _one_node() -> Topology:
    from ..gang import Topology, find_free_port

    return Topology(num_nodes=1, node_index=0, main_addr="127.0.0.1", ports=(find_free_port(),), is_local=True)
