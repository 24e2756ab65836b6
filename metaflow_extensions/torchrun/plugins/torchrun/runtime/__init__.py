"""The runtime: one step's gang and each of its calls, run in the task.

``GangSession`` is the step's gang from its first line to its last (join, the
step's code, leave); ``api.run(session, request)`` is the one entry for a call
(plan, process count, preflight, then the call: enter, prepare, supervise,
finish, record); the result is a ``TorchrunResult``, typed to the edge. The card,
the attempts record and 0.2's single-node launcher live here too.

Usage (the decorator and ``current.torch`` do this)::

    session = GangSession(identity, defaults, topology, flow_dir, secret=secret)
    session.join()
    result = api.run(session, CallRequest("train.py"))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import names_from

__all__ = [
    "card_ready",
    "card_view_command",
    "card_of_task",
    "GangSession",
    "METADATA_FIELD",
    "REPORT_ARTIFACT",
    "SingleNodeLauncher",
    "ThisAttempt",
    "TorchrunArgs",
    "TorchrunResult",
    "attach_card",
    "finish_card",
    "in_gang",
    "keep_record",
    "meta_datum",
    "read_node_history",
    "refresh_live",
    "render_card_now",
    "skip_render",
    "step_result",
    "name_local_control",
    "own_start",
    "close_runtime_warm",
    "prepare_local_nodes",
    "stop_local_nodes",
    "torchrun_args_of",
    "worker_python_problem",
    "api",
    "attempt_record",
    "attempts",
    "evidence",
    "goodput",
    "node_history",
    "preflight",
]

# Where each name lives: loaded on first use, so that importing the face costs nothing.
_HOME = {
    "card_ready": "card",
    "card_view_command": "card",
    "card_of_task": "card",
    "prepare_local_nodes": "local_nodes",
    "name_local_control": "local_nodes",
    "own_start": "local_nodes",
    "close_runtime_warm": "warm_start",
    "GangSession": "session",
    "METADATA_FIELD": "result",
    "REPORT_ARTIFACT": "result",
    "SingleNodeLauncher": "single_node",
    "ThisAttempt": "step_record",
    "in_gang": "step_run",
    "read_node_history": "step_record",
    "keep_record": "step_record",
    "meta_datum": "step_record",
    "step_result": "step_record",
    "TorchrunArgs": "torchrun_args",
    "TorchrunResult": "result",
    "attach_card": "card",
    "finish_card": "card",
    "refresh_live": "card",
    "render_card_now": "card",
    "skip_render": "card",
    "stop_local_nodes": "local_nodes",
    "torchrun_args_of": "torchrun_args",
    "worker_python_problem": "local_nodes",
}

if TYPE_CHECKING:
    from .card import card_of_task, card_ready, card_view_command
    from .card import attach_card, finish_card, refresh_live, render_card_now, skip_render
    from .warm_start import close_runtime_warm
    from .local_nodes import name_local_control, own_start, prepare_local_nodes, stop_local_nodes, worker_python_problem
    from .result import METADATA_FIELD, REPORT_ARTIFACT, TorchrunResult
    from .session import GangSession
    from .single_node import SingleNodeLauncher
    from .step_record import ThisAttempt, keep_record, meta_datum, read_node_history, step_result
    from .step_run import in_gang
    from .torchrun_args import TorchrunArgs, torchrun_args_of

if TYPE_CHECKING:
    from . import api, attempt_record, attempts, evidence, goodput, node_history, preflight


__getattr__ = names_from(__name__, _HOME, __all__)
