"""The runtime: one step's gang and each of its calls, run in the task.

``GangSession`` is the step's gang from its first line to its last (join, the
step's code, leave); ``api.run(session, request)`` is the one entry for a call
(plan, process count, preflight, then the call: enter, prepare, supervise,
finish); the result is a ``record.TorchrunResult``, typed to the edge. What a call
and the attempt leave behind is ``record/``'s, the card ``card/``'s; 0.2's
single-node launcher lives here.

Usage (the decorator and ``current.torch`` do this)::

    session = GangSession(identity, defaults, topology, flow_dir, secret=secret)
    session.join()
    result = api.run(session, CallRequest("train.py"))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import names_from

__all__ = [
    "GangSession",
    "SingleNodeLauncher",
    "TorchrunArgs",
    "attempt_facts",
    "in_gang",
    "read_node_history",
    "name_local_control",
    "own_start",
    "close_runtime_warm",
    "prepare_local_nodes",
    "stop_local_nodes",
    "torchrun_args_of",
    "worker_python_problem",
    "api",
    "preflight",
]

# Where each name lives: loaded on first use, so that importing the face costs nothing.
_HOME = {
    "prepare_local_nodes": "local_nodes",
    "name_local_control": "local_nodes",
    "own_start": "local_nodes",
    "close_runtime_warm": "warm_start",
    "GangSession": "session",
    "SingleNodeLauncher": "single_node",
    "attempt_facts": "step_run",
    "in_gang": "step_run",
    "read_node_history": "step_run",
    "TorchrunArgs": "torchrun_args",
    "stop_local_nodes": "local_nodes",
    "torchrun_args_of": "torchrun_args",
    "worker_python_problem": "local_nodes",
}

if TYPE_CHECKING:
    from .warm_start import close_runtime_warm
    from .local_nodes import name_local_control, own_start, prepare_local_nodes, stop_local_nodes, worker_python_problem
    from .session import GangSession
    from .single_node import SingleNodeLauncher
    from .step_run import attempt_facts, in_gang, read_node_history
    from .torchrun_args import TorchrunArgs, torchrun_args_of

if TYPE_CHECKING:
    from . import api, preflight


__getattr__ = names_from(__name__, _HOME, __all__)
