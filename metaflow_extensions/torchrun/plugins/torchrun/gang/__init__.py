"""The gang: the liveness service of one ``@torchrun`` step and its protocol.

The control task runs a ``GangServer``; every node (the control too) joins it
with a ``GangClient``, proves the step's secret, sends heartbeats, meets the
others at each ``current.torch.run`` call and hears of the first failure anywhere.
"""

from __future__ import annotations

from ..base.lazy import names_from

TYPE_CHECKING = False

__all__ = [
    "CONTROL_TASK_ID_ENV",
    "GangClient",
    "GangConfig",
    "GangFacts",
    "GangIdentity",
    "GangServer",
    "HostCheck",
    "JobRecord",
    "NodeReport",
    "PreflightRecord",
    "ProgressRecord",
    "Seat",
    "Topology",
    "find_free_port",
    "parse_port",
]

# Where each name lives: loaded on first use, so that `import metaflow` (which imports our
# decorator and exported classes) does not load the whole layer.
_MODULES = {
    "bench": ("Seat",),
    "client": ("GangClient",),
    "config": ("GangConfig",),
    "gang_progress": ("ProgressRecord",),
    "identity": ("GangIdentity",),
    "messages": ("NodeReport",),
    "node_compare": ("HostCheck", "JobRecord", "PreflightRecord"),
    "ports": ("find_free_port", "parse_port"),
    "server": ("GangFacts", "GangServer"),
    "topology": ("CONTROL_TASK_ID_ENV", "Topology"),
}

if TYPE_CHECKING:
    from .bench import Seat
    from .client import GangClient
    from .config import GangConfig
    from .gang_progress import ProgressRecord
    from .identity import GangIdentity
    from .messages import NodeReport
    from .node_compare import HostCheck, JobRecord, PreflightRecord
    from .ports import find_free_port, parse_port
    from .server import GangFacts, GangServer
    from .topology import CONTROL_TASK_ID_ENV, Topology

__getattr__ = names_from(__name__, {name: module for module, names in _MODULES.items() for name in names})
