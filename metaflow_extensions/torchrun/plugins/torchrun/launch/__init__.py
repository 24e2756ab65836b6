"""Launch planning, pure and before anything starts: ``plan_request`` makes the user's ``CallRequest``
and the step's ``StepDefaults`` a ``CallPlan`` (every problem named at once); once the gang has given the
call a port, ``prepare.prepare_launch`` makes it this node's torchrun argv and environment. torch is
never imported here (``torch_checks`` reads its files)::

    plan = plan_request(CallRequest("train.py", {"epochs": 3}), defaults, [flow_dir])
    argv, env, endpoint = prepare.prepare_launch(plan, defaults, node_facts, os.environ)
"""

from __future__ import annotations

from ..base.lazy import names_from

TYPE_CHECKING = False

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

# Where each name lives: loaded on first use, so that `import metaflow` (which imports our
# decorator and exported classes) does not load the whole layer.
_MODULES = {
    "command": ("ArgSpec",),
    "inputs": ("step_timeout", "validate_args_as", "validate_shutdown_grace", "validate_timeouts"),
    "plan": ("CallPlan", "CallRequest", "StepDefaults", "call_request", "merged_options", "plan_call", "plan_request"),
    "resources": ("NO_ACCELERATORS", "Accelerators", "requested_accelerators"),
}

if TYPE_CHECKING:
    from .command import ArgSpec
    from .inputs import step_timeout, validate_args_as, validate_shutdown_grace, validate_timeouts
    from .plan import CallPlan, CallRequest, StepDefaults, call_request, merged_options, plan_call, plan_request
    from .resources import NO_ACCELERATORS, Accelerators, requested_accelerators

__getattr__ = names_from(__name__, {name: module for module, names in _MODULES.items() for name in names})
