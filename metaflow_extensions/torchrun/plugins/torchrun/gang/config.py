"""The gang's settings (why a gang at all: docs/failures.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..base import defaults as DEFAULTS
from ..base import timeouts

# The node whose torchrun hosts the rendezvous store: the others launch only once it is there.
RDZV_STORE_NODE = 0
CONTROL_NODE = 0  # the node whose task hosts the gang service
# Heartbeats the service takes (and sends) in a second, at most: 1,024 a second
# each way cost it 12 to 13 % of a core on a 2-core machine (docs/benchmarks.md).
HEARTBEATS_PER_SECOND = 512.0
# Progress records it parses in a second, at most: one costs about 7 bare heartbeats.
PROGRESS_PER_SECOND = 128.0
# A node that heard nothing for this many heartbeat intervals probes (probing.py).
PROBE_AFTER_BEATS = 2.0
# Probes stand in for a silent connection for this many heartbeat_timeouts at most.
LINK_TIMEOUTS = 3.0


@dataclass(frozen=True)
class GangConfig:
    gang_id: str
    num_nodes: int
    heartbeat_timeout: float = DEFAULTS.HEARTBEAT_TIMEOUT
    start_timeout: float = DEFAULTS.START_TIMEOUT
    progress_interval: float = DEFAULTS.PROGRESS_SECONDS
    # An echo (a peer's closed gloo or NCCL connection) is held this long for a better root cause.
    secondary_grace: float = timeouts.SECONDARY_GRACE
    hang_timeout: Optional[float] = DEFAULTS.HANG_TIMEOUT  # None: never
    restarts: int = DEFAULTS.RESTARTS
    spares: int = 0
    min_nodes: Optional[int] = None  # a lost node with no spare left: go on where this many nodes still train
    regrow: bool = True  # a lost node back brings the gang back to its size at a restart
    survives_loss: bool = True  # the platform lets the step succeed without a lost node's task (not AWS Batch)
    swap_stragglers: Optional[float] = None  # seconds a rank named by arrival stays so before its node is swapped
    straggler_ratio: float = DEFAULTS.STRAGGLER_RATIO
    straggler_seconds: float = DEFAULTS.STRAGGLER_SECONDS

    @property
    def heartbeat_interval(self) -> float:
        """A tenth of the timeout, at most 1 s; past 512 nodes, a second per 512 nodes: the control's cost is flat."""
        base = max(0.05, min(1.0, self.heartbeat_timeout / 10.0))
        scaled = self.num_nodes / HEARTBEATS_PER_SECOND
        return max(base, min(scaled, self.heartbeat_timeout / 4.0))

    @property
    def probe_after(self) -> float:
        return PROBE_AFTER_BEATS * self.heartbeat_interval

    @property
    def link_timeout(self) -> float:
        return LINK_TIMEOUTS * self.heartbeat_timeout

    @property
    def progress_send(self) -> float:
        """Every 8 s at 1,024 nodes: the ranks' own time stamps keep the rates right."""
        return max(timeouts.PROGRESS_SEND, self.num_nodes / PROGRESS_PER_SECOND)
