"""One rank's life as a typed record, in its file, on the wire and in the public
result (``RankRecord`` is this class). ``from_wire`` raises ``StatusError`` on one
bad field; ``from_file`` reads leniently: a rank's file is a record to show.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, Dict, Mapping, Optional

from ..base.codec import Int, Real, Record
from .names import STATUS_SUFFIX, rank_file
from .records import MAX_TIME, read_rank_files, stamp, write_json

INT_LIMIT = 1 << 31  # ranks, pids, exit codes and restarts


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
        """``when`` is kept only where no end is known."""
        return dataclasses.replace(self, exit_code=exit_code, end=self.end if self.end is not None else when)

    @classmethod
    def from_file(cls, data: Any) -> Optional["RankStatus"]:
        if not isinstance(data, Mapping) or _whole(data.get("rank")) is None:
            return None
        return cls(rank=data["rank"], local_rank=_whole(data.get("local_rank"), -1),
                   group_rank=_whole(data.get("group_rank"), -1), restart=_whole(data.get("restart"), 0),
                   pid=_whole(data.get("pid"), -1), start=stamp(data.get("start")),
                   end=stamp(data.get("end")), exit_code=_whole(data.get("exit_code")))

    def for_wire(self) -> "RankStatus":
        """Within the wire's bounds (a rank that could not read its number wrote -1: 0 on the wire)."""
        return RankStatus(rank=max(0, _whole(self.rank, 0)), local_rank=max(-1, _whole(self.local_rank, -1)),
                          group_rank=max(-1, _whole(self.group_rank, -1)), restart=max(0, _whole(self.restart, 0)),
                          pid=max(-1, _whole(self.pid, -1)), start=stamp(self.start), end=stamp(self.end),
                          exit_code=_whole(self.exit_code))


def _whole(value: Any, default: Optional[int] = None) -> Any:
    ok = isinstance(value, int) and not isinstance(value, bool) and -INT_LIMIT < value < INT_LIMIT
    return value if ok else default


def write_status(directory: str, status: RankStatus) -> bool:
    """False where it could not be written: never worth failing the rank for."""
    try:
        write_json(rank_file(directory, status.rank, STATUS_SUFFIX), status.to_wire())
    except OSError:
        return False
    return True


def read_statuses(directory: str) -> Dict[int, RankStatus]:
    found: Dict[int, RankStatus] = {}
    for _, data in read_rank_files(directory, STATUS_SUFFIX):
        status = RankStatus.from_file(data)
        if status is not None:
            found[status.rank] = status
    return found
