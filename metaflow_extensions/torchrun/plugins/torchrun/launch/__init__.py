"""Launch planning: what one call will start, decided before anything starts.

Pure functions over typed records: the user's ``CallRequest`` and the step's
``StepDefaults`` become a ``CallPlan`` (``plan_request``: every argument
checked, every problem named at once, as ``TorchrunInvalidArgument``); once the
gang has given the call a port, ``prepare_launch`` makes it this node's torchrun argv
and environment (``NodeFacts``). No process is started here and torch is never
imported (``torch_checks`` reads its files).

The face shows what most callers use; anything else comes from its module
(``from ..launch.prepare import NodeFacts, prepare_launch``).

Usage (the runtime's ``api.run`` and its call do this)::

    plan = plan_request(CallRequest("train.py", {"epochs": 3}), defaults, [flow_dir])
    argv, env = prepare.prepare_launch(plan, defaults, node_facts, os.environ)
"""

from __future__ import annotations

from .command import ArgSpec
from .inputs import step_timeout, validate_args_as, validate_shutdown_grace, validate_timeouts
from .plan import CallPlan, CallRequest, StepDefaults, call_request, merged_options, plan_call, plan_request
from .resources import NO_ACCELERATORS, Accelerators, requested_accelerators

__all__ = [
    "Accelerators",
    "ArgSpec",
    "CallPlan",
    "CallRequest",
    "NO_ACCELERATORS",
    "StepDefaults",
    "call_request",
    "merged_options",
    "plan_call",
    "plan_request",
    "requested_accelerators",
    "step_timeout",
    "validate_args_as",
    "validate_shutdown_grace",
    "validate_timeouts",
]
