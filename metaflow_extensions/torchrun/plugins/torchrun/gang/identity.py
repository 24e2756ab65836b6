"""The gang's identity: one name for "this attempt of this step of this run".

Every id the gang hands out derives from it: the gang service's, each
``current.torch.run`` call's torchrun rendezvous id and the directories of the
per-rank logs. A retry (a new attempt) is a new gang, so it never meets any
state of the failed one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from ..host import LogKey


def safe_id(raw: str) -> str:
    """ASCII letters, digits and ``-_.`` only: torch, file systems and log
    readers all accept it."""
    return "".join(c if (c.isascii() and c.isalnum()) or c in "-_." else "_" for c in raw)


@dataclass(frozen=True)
class GangIdentity:
    flow_name: str
    run_id: str
    step_name: str
    control_task_id: str
    attempt: int

    @property
    def gang_id(self) -> str:
        """The same on every node of the step's attempt, different across
        retries, runs and foreach branches."""
        return safe_id(
            "%s-%s-%s-%s-%d"
            % (self.flow_name, self.run_id, self.step_name, self.control_task_id, self.attempt)
        )

    def call_id(self, call_index: int) -> str:
        """torchrun's rendezvous id for the step's ``call_index``-th call of
        ``current.torch.run`` (0-based): each call is its own rendezvous."""
        return "%s-c%d" % (self.gang_id, call_index)

    def call_names(self, call_index: int) -> Tuple[LogKey, str]:
        """The call's per-rank log directory and its rendezvous id, together:
        what a node names its share of the call by."""
        return self.log_key(call_index), self.call_id(call_index)

    def log_key(self, call_index: int) -> LogKey:
        """Where the call's per-rank logs go on each host: grouped by run (what
        retention keeps whole, and what a user looks for), then by the step's
        attempt, then by call."""
        return LogKey(
            run=safe_id("%s-%s" % (self.flow_name, self.run_id)),
            step=safe_id("%s-%s-%d" % (self.step_name, self.control_task_id, self.attempt)),
            call="c%d" % call_index,
        )
