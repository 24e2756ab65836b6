"""How a rank records its failure, and how its node reads the records back.

Kept free of Metaflow imports: ``bootstrap.py`` imports this inside every rank,
where start-up time matters and the Metaflow package need not be loaded.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict, dataclass
from typing import List

RANK_FAILURE_PREFIX = "rank-"
RANK_FAILURE_SUFFIX = ".failure.json"


@dataclass(frozen=True)
class RankFailure:
    """What one rank recorded about how it failed."""

    rank: int
    local_rank: int
    node_index: int
    host: str
    pid: int
    exc_type: str
    message: str
    traceback: str
    timestamp: float

    def summary(self) -> str:
        return "node %d, rank %d (local rank %d, pid %d on %s): %s: %s" % (
            self.node_index,
            self.rank,
            self.local_rank,
            self.pid,
            self.host,
            self.exc_type,
            self.message,
        )


def describe_exit_code(code: int) -> str:
    """Name a process exit status the way a user reads it (a signal, not -11)."""
    if code < 0:
        try:
            return "killed by signal %s" % signal.Signals(-code).name
        except ValueError:
            return "killed by signal %d" % -code
    if code > 128:
        try:
            return "exit code %d (%s)" % (code, signal.Signals(code - 128).name)
        except ValueError:
            pass
    return "exit code %d" % code


def failure_path(directory: str, rank: int) -> str:
    return os.path.join(
        directory, "%s%d%s" % (RANK_FAILURE_PREFIX, rank, RANK_FAILURE_SUFFIX)
    )


def write_failure(directory: str, failure: RankFailure) -> None:
    """Write atomically so a reader never sees half a record."""
    path = failure_path(directory, failure.rank)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(asdict(failure), f)
    os.replace(tmp, path)


def read_failures(directory: str) -> List[RankFailure]:
    """Every rank failure recorded in ``directory``, earliest first."""
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        if not (
            name.startswith(RANK_FAILURE_PREFIX) and name.endswith(RANK_FAILURE_SUFFIX)
        ):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                found.append(RankFailure(**json.load(f)))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(found, key=lambda f: f.timestamp)
