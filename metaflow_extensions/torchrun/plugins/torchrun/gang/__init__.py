"""The gang: the liveness service of one ``@torchrun`` step and its protocol.

The control task runs a ``GangServer``; every node (the control included) joins
it with a ``GangClient``, proves the step's secret, sends heartbeats, meets the
others at each ``current.torch.run`` call and hears of the first failure
anywhere. Everything on the wire is a typed record (``messages``), JSON only in
``to_wire``/``from_wire``. ``Topology`` and ``GangIdentity`` say who this node is
and which gang it belongs to; ``ports`` chooses where it meets.

Usage (the runtime's session does this)::

    server = GangServer(config, bind_host, ports, secret=secret)   # on the control
    client = GangClient(config, main_addr, ports, node_index, secret=secret)
    client.start(); port = client.enter_call(0, "train.py")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import names_from

__all__ = [
    "CONTROL_TASK_ID_ENV",
    "DEFAULT_MODE",
    "GangClient",
    "send_last_progress",
    "GangConfig",
    "GangFacts",
    "GangIdentity",
    "GangServer",
    "JobRecord",
    "MAX_RANKS_PER_NODE",
    "NodeEnd",
    "NodeReport",
    "Bench",
    "Seat",
    "HostCheck",
    "PreflightRecord",
    "ProgressRecord",
    "ProgressTracker",
    "Straggler",
    "ProtocolError",
    "RDZV_STORE_NODE",
    "RankStatus",
    "STREAMS",
    "TAIL_LINES",
    "TAIL_LINE_CHARS",
    "Topology",
    "describe_job",
    "find_free_port",
    "is_local_runtime",
    "make_secret",
    "own_command_port",
    "parse_mode",
    "parse_port",
    "topology_from",
    "gang_progress",
    "messages",
    "node_compare",
    "secret",
]

# Where each name lives: loaded on first use, so that importing the face costs nothing.
_HOME = {
    "CONTROL_TASK_ID_ENV": "topology",
    "DEFAULT_MODE": "node_compare",
    "GangClient": "client",
    "send_last_progress": "client",
    "GangConfig": "config",
    "GangFacts": "server",
    "GangIdentity": "identity",
    "GangServer": "server",
    "JobRecord": "node_compare",
    "MAX_RANKS_PER_NODE": "messages",
    "NodeEnd": "membership",
    "NodeReport": "messages",
    "Bench": "bench",
    "Seat": "bench",
    "HostCheck": "node_compare",
    "PreflightRecord": "node_compare",
    "ProgressRecord": "gang_progress",
    "ProgressTracker": "node_progress",
    "Straggler": "gang_progress",
    "ProtocolError": "messages",
    "RDZV_STORE_NODE": "config",
    "RankStatus": "messages",
    "STREAMS": "messages",
    "TAIL_LINES": "messages",
    "TAIL_LINE_CHARS": "messages",
    "Topology": "topology",
    "describe_job": "node_compare",
    "find_free_port": "ports",
    "is_local_runtime": "topology",
    "make_secret": "secret",
    "own_command_port": "ports",
    "parse_mode": "node_compare",
    "parse_port": "ports",
    "topology_from": "topology",
}

if TYPE_CHECKING:
    from .client import GangClient, send_last_progress
    from .config import GangConfig, RDZV_STORE_NODE
    from .identity import GangIdentity
    from .membership import NodeEnd
    from .bench import Bench, Seat
    from .node_compare import HostCheck
    from .messages import MAX_RANKS_PER_NODE, NodeReport, ProtocolError, RankStatus, STREAMS, TAIL_LINES, TAIL_LINE_CHARS
    from .node_compare import DEFAULT_MODE, JobRecord, PreflightRecord, describe_job, parse_mode
    from .gang_progress import ProgressRecord, Straggler
    from .node_progress import ProgressTracker
    from .ports import find_free_port, own_command_port, parse_port
    from .secret import make_secret
    from .server import GangFacts, GangServer
    from .topology import CONTROL_TASK_ID_ENV, Topology, is_local_runtime, topology_from

if TYPE_CHECKING:
    from . import gang_progress, messages, node_compare, secret


__getattr__ = names_from(__name__, _HOME, __all__)
