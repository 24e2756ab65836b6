"""How a rank records its failure, and how its node reads the records back.

Kept free of Metaflow imports: ``bootstrap.py`` imports this inside every rank,
where start-up time matters and the Metaflow package need not be loaded.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from dataclasses import asdict, dataclass, replace
from typing import List

from .names import FAILURE_SUFFIX, rank_file, rank_of

# What a rank that died without recording an exception is said to have done;
# its exit (a signal, a code) is the failure's type.
NO_EXCEPTION = "the process ended without a Python exception"
OUTPUT_LINES = 20  # of a dead rank's stderr, where nothing says where its crash began
CONTEXT_LINES = 5  # before Python's "Fatal Python error"
MAX_OUTPUT_LINES = 60


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

    @property
    def secondary(self) -> bool:
        """A failure that another failure most likely caused (see ``is_secondary``)."""
        return is_secondary(self.exc_type, self.message)

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


# A new file only this user can read (0600), never through a symlink.
PRIVATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)


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


# What a rank says when a *peer* went away: gloo's and NCCL's messages for a
# closed connection, a TCPStore whose host died, and a rank that torchrun's own
# agent stopped once another rank had failed. None of these is a root cause when
# a failure of another kind is known.
_SECONDARY_MESSAGES = (
    "connection closed by peer",
    "connection reset by peer",
    "remote worker crashing",
    "remote process exited",
    "ncclremoteerror",
    "nccl communicator was aborted",
    "failed to recv, got 0 bytes",
    "broken pipe",
)
_SECONDARY_SIGNALS = ("SIGTERM",)


def is_secondary(exc_type: str, message: str) -> bool:
    """Does this failure look like the echo of another one (a peer that died)?

    Only used to order failures: when every failure is secondary, the earliest
    is still reported.
    """
    text = (message or "").lower()
    if any(m in text for m in _SECONDARY_MESSAGES):
        return True
    return any((exc_type or "").endswith("signal %s" % name) for name in _SECONDARY_SIGNALS)


def root_cause_order(failures: List["RankFailure"]) -> List["RankFailure"]:
    """Failures of their own kind first, then echoes of others; earliest first
    within each. torchrun stamps the failures it reports to the second, so time
    alone cannot tell a segfault from the connection errors it caused."""
    return sorted(failures, key=lambda f: (f.secondary, f.timestamp))


def failure_path(directory: str, rank: int) -> str:
    return rank_file(directory, rank, FAILURE_SUFFIX)


def write_failure(directory: str, failure: RankFailure) -> None:
    """Write atomically so a reader never sees half a record."""
    path = failure_path(directory, failure.rank)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with os.fdopen(os.open(tmp, PRIVATE_NEW, 0o600), "w") as f:
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
        if rank_of(name, FAILURE_SUFFIX) is None:
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                found.append(RankFailure(**json.load(f)))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(found, key=lambda f: f.timestamp)


# torchrun's failure report ("rank : 1 (local_rank: 1)" / "exitcode : -11 (pid: 42)").
_SUMMARY_ENTRY = re.compile(
    rb"time\s*:\s*(?P<time>\S+)\s*\n"
    rb"\s*host\s*:\s*(?P<host>\S+)\s*\n"
    rb"\s*rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\)\s*\n"
    rb"\s*exitcode\s*:\s*(?P<code>-?\d+)\s*\(pid:\s*(?P<pid>\d+)\)"
)


def parse_torchrun_summary(text: bytes, node_index: int) -> List[RankFailure]:
    """Rank failures from torchrun's own report, for ranks that could not record
    anything themselves (killed by a signal: segfault, OOM killer, SIGKILL)."""
    found = {}
    for m in _SUMMARY_ENTRY.finditer(text):
        code = int(m.group("code"))
        try:
            stamp = time.mktime(time.strptime(m.group("time").decode(), "%Y-%m-%d_%H:%M:%S"))
        except ValueError:
            stamp = time.time()
        found[int(m.group("rank"))] = RankFailure(
            rank=int(m.group("rank")),
            local_rank=int(m.group("local")),
            node_index=node_index,
            host=m.group("host").decode(errors="replace"),
            pid=int(m.group("pid")),
            exc_type=describe_exit_code(code),
            message=NO_EXCEPTION,
            traceback="",
            timestamp=stamp,
        )
    return sorted(found.values(), key=lambda f: f.timestamp)


def with_last_output(failure: RankFailure, lines: List[str]) -> RankFailure:
    """A rank killed by a signal left no traceback of its own; what it wrote last
    (faulthandler's dump of a crash, C++'s "terminate called after throwing
    ...", a CUDA assert) is the nearest thing, and usually names the cause."""
    if failure.traceback:
        return failure
    shown = crash_output(lines)
    if not shown:
        return failure
    return replace(failure, traceback="The rank's last lines of stderr:\n%s" % "\n".join(shown))


def crash_output(lines: List[str]) -> List[str]:
    """The part of a dead rank's stderr worth showing: from just before Python's
    "Fatal Python error" (where C++ prints what it threw), else the last lines;
    faulthandler's one-line list of extension modules is left out."""
    lines = [line for line in lines if not line.startswith("Extension modules:")]
    start = max(0, len(lines) - OUTPUT_LINES)
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Fatal Python error"):
            start = max(0, i - CONTEXT_LINES)
            break
    return lines[start:start + MAX_OUTPUT_LINES]


def merge_failures(recorded: List[RankFailure], reported: List[RankFailure]) -> List[RankFailure]:
    """A rank's own record (with its traceback) wins over torchrun's report of
    it; the result is in root-cause order (``root_cause_order``)."""
    ranks = {f.rank for f in recorded}
    return root_cause_order(recorded + [f for f in reported if f.rank not in ranks])
