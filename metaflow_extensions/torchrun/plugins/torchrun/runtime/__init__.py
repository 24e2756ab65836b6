"""The runtime: one step's gang (``GangSession``) and each of its calls
(``api.run``, imported by path), and 0.2's single-node launcher. The face shows
what the decorator, ``current.torch`` and 0.2's launcher use.
"""

from __future__ import annotations

from ..base.lazy import names_from

TYPE_CHECKING = False

__all__ = [
    "GangSession", "SingleNodeLauncher", "TorchrunArgs", "attempt_facts", "close_runtime_warm", "in_gang",
    "name_local_control", "own_start", "prepare_local_nodes", "read_node_history", "stop_local_nodes",
    "torchrun_args_of",
]

# Where each name lives: loaded on first use, so that `import metaflow` (which imports our
# decorator and exported classes) does not load the whole layer.
_MODULES = {
    "in_runtime": ("name_local_control",),
    "local_nodes": ("own_start", "prepare_local_nodes", "stop_local_nodes"),
    "session": ("GangSession",),
    "single_node": ("SingleNodeLauncher",),
    "step_run": ("attempt_facts", "in_gang", "read_node_history"),
    "torchrun_args": ("TorchrunArgs", "torchrun_args_of"),
    "warm_start": ("close_runtime_warm",),
}

if TYPE_CHECKING:
    from .in_runtime import name_local_control
    from .local_nodes import own_start, prepare_local_nodes, stop_local_nodes
    from .session import GangSession
    from .single_node import SingleNodeLauncher
    from .step_run import attempt_facts, in_gang, read_node_history
    from .torchrun_args import TorchrunArgs, torchrun_args_of
    from .warm_start import close_runtime_warm

__getattr__ = names_from(__name__, {name: module for module, names in _MODULES.items() for name in names})
