"""Cross-node liveness for a whole ``@torchrun`` step: every node learns within
seconds that the gang is over, wherever in its step each node is.

torchrun's agent watches only its own node: when a node dies, its peers wait for
an NCCL or gloo timeout (10 to 30 minutes), and a node that fails before it
starts torchrun leaves the others waiting in the rendezvous. Here the control
task hosts a small TCP service (``server.py``) that every node, itself
included, joins when its step starts and leaves when its step ends
(``client.py``). Only the control's address is known to all nodes, so this
works the same locally, on Kubernetes and on AWS Batch. ``messages.py`` is the
protocol, ``wire.py`` its framing; ``cause`` the typed record of why a gang
stopped. This module holds the gang's settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..base import defaults as DEFAULTS
from ..base import timeouts

# The node whose torchrun hosts the rendezvous store (``is_host=1`` in
# command.py): the gang launches the other nodes only once it is there.
RDZV_STORE_NODE = 0
# The node whose task hosts the gang service (Metaflow's control task).
CONTROL_NODE = 0
# Heartbeats the control's service takes (and sends) in a second, at most,
# whatever the gang's size: past 512 nodes the interval grows with the gang (see
# below). With every heartbeat on time, 1,024 a second each way cost the control
# 12 to 13 % of a core on a 2-core machine, 512 half that (docs/benchmarks.md).
HEARTBEATS_PER_SECOND = 512.0
# Progress records (gang/node_progress.py) it parses in a second, at most: one
# costs it about 7 bare heartbeats, so past 384 nodes they come less often (at
# 256 a second, progress added 10 to 25 % to the control's idle CPU at 1,024 nodes).
PROGRESS_PER_SECOND = 128.0
# A node that heard nothing from the control for this many heartbeat intervals
# probes on a fresh connection (probing.py): TCP's backoff may hold its own
# connection's resends back for about as long as a cut lasted.
PROBE_AFTER_BEATS = 2.0
# Probes stand in for a silent connection for this many heartbeat_timeouts at
# most: a cut shorter than one is resent on the connection within about twice
# its length; one silent longer is dead, however the probes fare.
LINK_TIMEOUTS = 3.0


@dataclass(frozen=True)
class GangConfig:
    gang_id: str
    num_nodes: int
    heartbeat_timeout: float = DEFAULTS.HEARTBEAT_TIMEOUT
    start_timeout: float = DEFAULTS.START_TIMEOUT
    # How often the control says who is still missing while nodes join.
    progress_interval: float = DEFAULTS.PROGRESS_SECONDS
    # A node whose ranks failed only because a peer went away (a closed gloo or
    # NCCL connection) often reports before the node where the real failure
    # happened: its report is held this long for a better root cause. That node
    # reports once its torchrun agent has stopped its other ranks and exited:
    # about 1 s on an idle 2-core machine, over 1.5 s seen under load.
    secondary_grace: float = timeouts.SECONDARY_GRACE
    # Seconds without a line from any rank of a running call before the gang
    # stops as hung; None: never (``@torchrun(hang_timeout)``).
    hang_timeout: Optional[float] = DEFAULTS.HANG_TIMEOUT
    # Times a call's ranks may be restarted in the same tasks (@torchrun(restarts)):
    # the service decides each restart (gang/restarts.py).
    restarts: int = DEFAULTS.RESTARTS
    # Nodes that wait to replace a node a failure is pinned to (@torchrun(spares)): bench.py.
    spares: int = 0
    # A node this many times slower than the median node for this many seconds
    # is named a straggler (gang_progress.py).
    straggler_ratio: float = DEFAULTS.STRAGGLER_RATIO
    straggler_seconds: float = DEFAULTS.STRAGGLER_SECONDS

    @property
    def heartbeat_interval(self) -> float:
        """A tenth of the timeout, at most 1 s, so a silence is a real one; past
        512 nodes, one second per 512 nodes, so the control's cost per
        second stays flat (at most a quarter of the timeout: detection is
        heartbeat_timeout plus the check period whatever the interval)."""
        base = max(0.05, min(1.0, self.heartbeat_timeout / 10.0))
        scaled = self.num_nodes / HEARTBEATS_PER_SECOND
        return max(base, min(scaled, self.heartbeat_timeout / 4.0))

    @property
    def probe_after(self) -> float:
        """A node silent this long probes, once per heartbeat interval (probing.py)."""
        return PROBE_AFTER_BEATS * self.heartbeat_interval

    @property
    def link_timeout(self) -> float:
        """A node whose connection carried nothing for this long stops, whatever its probes heard."""
        return LINK_TIMEOUTS * self.heartbeat_timeout

    @property
    def progress_send(self) -> float:
        """How often a node's heartbeat carries its ranks' progress: every
        ``PROGRESS_SEND`` seconds, and no more than ``PROGRESS_PER_SECOND``
        records a second reach the control whatever the gang's size (every
        8 s at 1,024 nodes, 32 s at 4,096: the ranks' own time stamps keep
        the rates right; the step shown is that much older)."""
        return max(timeouts.PROGRESS_SEND, self.num_nodes / PROGRESS_PER_SECOND)
