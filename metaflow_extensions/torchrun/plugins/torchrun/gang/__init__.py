"""The gang: the liveness service of one ``@torchrun`` step and its protocol.

The control task runs a ``GangServer``; every node (the control too) joins it with a
``GangClient``, proves the step's secret, sends heartbeats, meets the others at each
``current.torch.run`` call and hears of the first failure anywhere.

- the service: ``server``, ``transport`` (its sockets), ``admission`` and ``auth`` (who may
  speak), ``handlers`` (what it hears and how it answers), ``recovery`` (what it does next: the one
  policy), ``membership``, ``calls``, ``silence``, ``speaker``, ``bench``,
  ``snapshot_directory`` (the service's part of the snapshots, ``snapshots/``: where each node's go);
- a node's end: ``client``, ``peer``, ``joining``, ``probing``;
- the protocol: ``messages``, ``wire``, ``identity``, ``secret`` (and ``step_end``, the control's word
  that its step ended fine), ``ports``, ``topology``, ``config``;
- what the gang compares and reports: ``node_compare`` and ``preflight_modes`` (preflight),
  ``gang_progress`` (training progress).

It may import ``errors``, ``cause``, ``procs``, ``host`` and ``base``.
"""

from .bench import Seat
from .client import GangClient, GangFacts
from .config import GangConfig
from .gang_progress import ProgressRecord
from .identity import GangIdentity
from .messages import NodeReport
from .node_compare import HostCheck, JobRecord, PreflightRecord
from .ports import find_free_port, parse_port
from .server import GangServer
from .topology import CONTROL_TASK_ID_ENV, Topology

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
