"""The gang's identity, "this attempt of this step of this run", from which every
id derives: a retry is a new gang that never meets the failed one's state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from ..host.logs import LogKey


def safe_id(raw: str) -> str:
    """ASCII letters, digits and ``-_.``: torch, file systems and log readers accept it."""
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
        return safe_id("%s-%s-%s-%s-%d" % (self.flow_name, self.run_id, self.step_name, self.control_task_id,
                                           self.attempt))

    def call_id(self, call_index: int) -> str:
        """Each call is its own rendezvous."""
        return "%s-c%d" % (self.gang_id, call_index)

    def call_names(self, call_index: int) -> Tuple[LogKey, str]:
        return self.log_key(call_index), self.call_id(call_index)

    def log_key(self, call_index: int) -> LogKey:
        """By run (what retention keeps whole, and a user looks for), attempt, call."""
        return LogKey(
            run=safe_id("%s-%s" % (self.flow_name, self.run_id)),
            step=safe_id("%s-%s-%d" % (self.step_name, self.control_task_id, self.attempt)),
            call="c%d" % call_index,
        )
