"""Launch planning: what one call will start, decided before anything starts.

Pure functions over typed records: the user's ``CallRequest`` and the step's
``StepDefaults`` become a ``CallPlan`` (``plan_request``: every argument
checked, every problem named at once, as ``TorchrunInvalidArgument``); once the
gang has given the call a port, ``prepare_launch`` makes it this node's torchrun argv
and environment (``NodeFacts``). No process is started here and torch is never
imported (``torch_checks`` reads its files).

Usage (the runtime's ``api.run`` does this)::

    plan = plan_request(CallRequest("train.py", {"epochs": 3}), defaults, [flow_dir])
    argv, env = prepare_launch(plan, defaults, node_facts, os.environ)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import names_from

__all__ = [
    "ZYGOTE_MODULE",
    "find_torch",
    "refuse_step_functions",
    "refuse_one_node_on_kubernetes",
    "check_port_clash",
    "Accelerators",
    "ArgSpec",
    "CallPlan",
    "CallRequest",
    "call_request",
    "ORDER_0_2",
    "NO_ACCELERATORS",
    "NodeFacts",
    "StepDefaults",
    "argparse_hint",
    "check_options",
    "check_visible_devices",
    "keyword_note",
    "legacy_rdzv_port",
    "merged_options",
    "none_keys",
    "none_note",
    "nproc_for_keyword",
    "option_names",
    "plan_call",
    "plan_request",
    "prepare_launch",
    "requested_accelerators",
    "resolve_nproc",
    "small_shm_warning",
    "step_timeout",
    "validate_args_as",
    "validate_hang_timeout",
    "validate_restarts",
    "validate_spares",
    "check_spares_fit",
    "restarts_allowed",
    "restarts_clash",
    "retry_on_clash",
    "validate_nproc",
    "validate_shutdown_grace",
    "validate_timeouts",
    "node_checks",
]

# Where each name lives: loaded on first use, so that importing the face costs nothing.
_HOME = {
    "ZYGOTE_MODULE": "command",
    "find_torch": "torch_checks",
    "refuse_step_functions": "platforms",
    "refuse_one_node_on_kubernetes": "platforms",
    "check_port_clash": "platforms",
    "Accelerators": "resources",
    "ArgSpec": "command",
    "CallPlan": "plan",
    "CallRequest": "plan",
    "call_request": "plan",
    "ORDER_0_2": "plan",
    "NO_ACCELERATORS": "resources",
    "NodeFacts": "prepare",
    "StepDefaults": "plan",
    "argparse_hint": "command",
    "check_options": "plan",
    "check_visible_devices": "resources",
    "keyword_note": "resources",
    "legacy_rdzv_port": "plan",
    "merged_options": "plan",
    "none_keys": "command",
    "none_note": "plan",
    "nproc_for_keyword": "resources",
    "option_names": "plan",
    "plan_call": "plan",
    "plan_request": "plan",
    "prepare_launch": "prepare",
    "requested_accelerators": "resources",
    "resolve_nproc": "plan",
    "small_shm_warning": "resources",
    "step_timeout": "inputs",
    "validate_args_as": "inputs",
    "validate_hang_timeout": "inputs",
    "validate_restarts": "inputs",
    "validate_spares": "inputs",
    "check_spares_fit": "inputs",
    "restarts_allowed": "command",
    "restarts_clash": "inputs",
    "retry_on_clash": "inputs",
    "validate_nproc": "plan",
    "validate_shutdown_grace": "inputs",
    "validate_timeouts": "inputs",
}

if TYPE_CHECKING:
    from .torch_checks import find_torch
    from .platforms import refuse_step_functions
    from .platforms import refuse_one_node_on_kubernetes
    from .platforms import check_port_clash
    from .command import ZYGOTE_MODULE, ArgSpec, argparse_hint, none_keys, restarts_allowed
    from .inputs import check_spares_fit, validate_spares
    from .inputs import (restarts_clash, retry_on_clash, step_timeout, validate_args_as, validate_hang_timeout, validate_restarts,
                         validate_shutdown_grace, validate_timeouts)
    from .plan import ORDER_0_2, CallPlan, CallRequest, StepDefaults, call_request, check_options, legacy_rdzv_port, merged_options, none_note, option_names, plan_call, plan_request, resolve_nproc, validate_nproc
    from .prepare import NodeFacts, prepare_launch
    from .resources import Accelerators, NO_ACCELERATORS, check_visible_devices, keyword_note, nproc_for_keyword, requested_accelerators, small_shm_warning

if TYPE_CHECKING:
    from . import node_checks


__getattr__ = names_from(__name__, _HOME, __all__)
