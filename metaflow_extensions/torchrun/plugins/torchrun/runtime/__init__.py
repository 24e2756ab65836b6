"""The runtime: one step's gang (``GangSession``) and each of its calls
(``api.run``, imported by path), and 0.2's single-node launcher. The face shows
what the decorator, ``current.torch`` and 0.2's launcher use.
"""

from __future__ import annotations

from .local_nodes import name_local_control, own_start, prepare_local_nodes, stop_local_nodes
from .session import GangSession
from .single_node import SingleNodeLauncher
from .step_run import attempt_facts, in_gang, read_node_history
from .torchrun_args import TorchrunArgs, torchrun_args_of
from .warm_start import close_runtime_warm

__all__ = [
    "GangSession", "SingleNodeLauncher", "TorchrunArgs", "attempt_facts", "close_runtime_warm", "in_gang",
    "name_local_control", "own_start", "prepare_local_nodes", "read_node_history", "stop_local_nodes",
    "torchrun_args_of",
]
