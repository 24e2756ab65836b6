"""The runtime: one step's gang and each of its calls, run in the task.

``GangSession`` is the step's gang from its first line to its last (join, the
step's code, leave); ``api.run(session, request)`` is the one entry for a call
(plan, process count, preflight, then the call: enter, prepare, supervise,
finish); the result is a ``record.TorchrunResult``, typed to the edge. What a call
and the attempt leave behind is ``record/``'s, the card ``card/``'s; 0.2's
single-node launcher lives here.

The face shows what the decorator, ``current.torch`` and 0.2's launcher use;
the call's entry is a module of its own (``from ..runtime import api``).

Usage (the decorator and ``current.torch`` do this)::

    session = GangSession(identity, defaults, topology, flow_dir, secret=secret)
    session.join()
    result = api.run(session, CallRequest("train.py"))
"""

from __future__ import annotations

from .local_nodes import name_local_control, own_start, prepare_local_nodes, stop_local_nodes
from .session import GangSession
from .single_node import SingleNodeLauncher
from .step_run import attempt_facts, in_gang, read_node_history
from .torchrun_args import TorchrunArgs, torchrun_args_of
from .warm_start import close_runtime_warm

__all__ = [
    "GangSession",
    "SingleNodeLauncher",
    "TorchrunArgs",
    "attempt_facts",
    "close_runtime_warm",
    "in_gang",
    "name_local_control",
    "own_start",
    "prepare_local_nodes",
    "read_node_history",
    "stop_local_nodes",
    "torchrun_args_of",
]
