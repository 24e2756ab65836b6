"""One rank's life as a typed record: the one schema of a rank's status.

The same record is written by the rank itself (``bootstrap.py``: at its start,
then at its exit), completed by its agent for a rank killed by a signal
(``exits.py``), sent to the control in a node's report (``gang/messages.py``)
and kept in the public result (``record/result.py``'s ``RankRecord`` is this
class). Its JSON, in the status file, on the wire and in the result's record,
is ``to_wire``: the eight fields below, in this order.

Two ways back from JSON: ``from_wire`` checks every field (``codec.py``, by
the bounds on each field's type) and raises ``StatusError`` (a peer's message:
the gang drops a peer that sends one bad field); ``from_file`` reads what a rank wrote leniently (a field of the wrong
type is unknown), because a rank's file is a record to show, not a request.
No Metaflow, no torch: every rank imports this.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Annotated, Any, Dict, Mapping, Optional

from ..base.codec import Int, Real, Record
from .names import STATUS_SUFFIX, rank_file, rank_of
from .records import read_json, write_json

# Ranks, pids, exit codes and restarts fit in 32 bits; times are epoch seconds.
INT_LIMIT = 1 << 31
MAX_TIME = 1e12


class StatusError(ValueError):
    """A rank status from the wire that does not hold to the schema."""


Count = Annotated[int, Int(-1, INT_LIMIT)]
Time = Annotated[Optional[float], Real(0.0, MAX_TIME)]


@dataclass(frozen=True)
class RankStatus(Record):
    """One rank as its node saw it. -1 or None: unknown."""

    ERROR = StatusError
    rank: Annotated[int, Int(0, INT_LIMIT)]
    local_rank: Count
    group_rank: Count = -1  # the node's rank in torch's rendezvous (0 is a real one)
    restart: Annotated[int, Int(0, INT_LIMIT)] = 0  # torchelastic's restart count when the rank started
    pid: Count = -1
    start: Time = None
    end: Time = None
    exit_code: Annotated[Optional[int], Int(-INT_LIMIT, INT_LIMIT)] = None  # negative: the signal that ended it

    @property
    def duration(self) -> Optional[float]:
        if self.start is None or self.end is None:
            return None
        return self.end - self.start

    def ended(self, exit_code: int, when: float) -> "RankStatus":
        """This record with an exit: ``when`` is kept only where no end is known."""
        return dataclasses.replace(self, exit_code=exit_code, end=self.end if self.end is not None else when)

    @classmethod
    def from_file(cls, data: Any) -> Optional["RankStatus"]:
        """What a rank (or its agent) wrote: None without a whole-number rank;
        any other field of the wrong type or range is unknown."""
        if not isinstance(data, Mapping) or _whole(data.get("rank")) is None:
            return None
        return cls(rank=data["rank"], local_rank=_whole(data.get("local_rank"), -1),
                   group_rank=_whole(data.get("group_rank"), -1), restart=_whole(data.get("restart"), 0),
                   pid=_whole(data.get("pid"), -1), start=_stamp(data.get("start")),
                   end=_stamp(data.get("end")), exit_code=_whole(data.get("exit_code")))

    def for_wire(self) -> "RankStatus":
        """This record within the wire's bounds, whatever it was built from (a
        rank that could not read its own number wrote -1: rank 0 on the wire)."""
        return RankStatus(rank=max(0, _whole(self.rank, 0)), local_rank=max(-1, _whole(self.local_rank, -1)),
                          group_rank=max(-1, _whole(self.group_rank, -1)), restart=max(0, _whole(self.restart, 0)),
                          pid=max(-1, _whole(self.pid, -1)), start=_stamp(self.start), end=_stamp(self.end),
                          exit_code=_whole(self.exit_code))


def _whole(value: Any, default: Optional[int] = None) -> Any:
    ok = isinstance(value, int) and not isinstance(value, bool) and -INT_LIMIT < value < INT_LIMIT
    return value if ok else default


def _stamp(value: Any) -> Optional[float]:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and 0 <= value <= MAX_TIME
    return float(value) if ok else None


# -- the status files of a call's work directory ---------------------------------


def status_path(directory: str, rank: int) -> str:
    return rank_file(directory, rank, STATUS_SUFFIX)


def write_status(directory: str, status: RankStatus) -> bool:
    """Atomically, privately; False where it could not be written (a rank's
    record is never worth failing the rank for)."""
    try:
        write_json(status_path(directory, status.rank), status.to_wire())
    except OSError:
        return False
    return True


def read_status(path: str) -> Optional[RankStatus]:
    return RankStatus.from_file(read_json(path))


def read_statuses(directory: str) -> Dict[int, RankStatus]:
    """Every rank's status in ``directory``, by rank; unreadable files skipped."""
    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    found: Dict[int, RankStatus] = {}
    for name in sorted(names):
        if rank_of(name, STATUS_SUFFIX) is None:
            continue
        status = read_status(os.path.join(directory, name))
        if status is not None:
            found[status.rank] = status
    return found
