"""Launch planning, pure and before anything starts: ``plan_request`` makes the user's ``CallRequest``
and the step's ``StepDefaults`` a ``CallPlan`` (every problem named at once); once the gang has given the
call a port, ``prepare.prepare_launch`` makes it this node's torchrun argv and environment::

    plan = plan_request(CallRequest("train.py", {"epochs": 3}), defaults, [flow_dir])
    argv, env, endpoint = prepare.prepare_launch(plan, defaults, node_facts, os.environ)

- planning: ``plan``, ``inputs`` (bad inputs refused), ``options`` (torchrun's options read),
  ``resources`` (processes per node from the requested hardware), ``platforms``;
- making it concrete: ``prepare``, ``command`` (torchrun's argv);
- checks before a start: ``torch_checks`` (the task's torch, read from its files, never imported),
  ``node_checks`` (each node's preflight fingerprint).

It may import ``gang``, ``cause``, ``errors``, ``procs``, ``host`` and ``base``; torch never.
"""

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
