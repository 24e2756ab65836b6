"""How a rank records its failure, and how its node reads the records back."""

from __future__ import annotations

import os
import signal
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, List, Optional

from .names import (AGENT_FAILURES_FILE, EXCEPTION_SUFFIX, FAILURE_SUFFIX, RETURN_SUFFIX, STACKS_SUFFIX, rank_file,
                    rank_of)
from .records import read_json, read_rank_files, write_json

NO_EXCEPTION = "the process ended without a Python exception"
OUTPUT_LINES = 20  # of a dead rank's stderr, where nothing says where its crash began
CONTEXT_LINES = 5  # before Python's "Fatal Python error"
MAX_OUTPUT_LINES = 60


@dataclass(frozen=True)
class RankFailure:
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
        """The echo of another failure (a peer that died)? Orders failures only:
        when every one is secondary, the earliest is still reported."""
        text = (self.message or "").lower()
        return any(m in text for m in _SECONDARY_MESSAGES) or (self.exc_type or "").endswith("signal SIGTERM")

    def summary(self) -> str:
        return "node %d, rank %d (local rank %d, pid %d on %s): %s: %s" % (
            self.node_index, self.rank, self.local_rank, self.pid, self.host, self.exc_type, self.message)


def describe_exit_code(code: int) -> str:
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


# What a rank says when a peer went away (gloo, NCCL, a TCPStore whose host died);
# with SIGTERM (torchrun's agent stopping the rest), never a root cause beside another kind.
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


def root_cause_order(failures: List["RankFailure"]) -> List["RankFailure"]:
    """Failures of their own kind first, then echoes: torchrun stamps its reports
    to the second, so time alone cannot tell a segfault from what it caused."""
    return sorted(failures, key=lambda f: (f.secondary, f.timestamp))


def failure_path(directory: str, rank: int) -> str:
    return rank_file(directory, rank, FAILURE_SUFFIX)


def write_failure(directory: str, failure: RankFailure) -> None:
    write_json(failure_path(directory, failure.rank), asdict(failure))


def read_failures(directory: str) -> List[RankFailure]:
    found = []
    for _, data in read_rank_files(directory, FAILURE_SUFFIX):
        try:
            found.append(RankFailure(**data))
        except TypeError:  # not an object, or not our fields
            continue
    return sorted(found, key=lambda f: f.timestamp)


@dataclass(frozen=True)
class AgentFailure:
    """A worker torch's agent saw fail (its ``ChildFailedError``): the record of
    a rank that could not write its own (a segfault, the OOM killer)."""

    rank: int  # the global rank
    local_rank: int
    pid: int
    exitcode: int  # negative: the signal that ended it
    signal: Optional[str]  # its name, when a signal ended it
    timestamp: float
    host: str
    error_file: Optional[str] = None  # torchelastic's error file of the rank, if it wrote one
    error_file_data: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, rank: int, failure: Any, host: str) -> "AgentFailure":
        """From torch's ``ProcessFailure`` (read by attribute: no torch import here)."""
        name = failure.signal_name() if failure.exitcode < 0 else None
        data = failure.error_file_data if isinstance(failure.error_file_data, dict) else {}
        error_file = failure.error_file if os.path.isfile(str(failure.error_file)) else None
        return cls(rank=int(rank), local_rank=int(failure.local_rank), pid=int(failure.pid),
                   exitcode=int(failure.exitcode), signal=name, timestamp=float(failure.timestamp),
                   host=host, error_file=error_file, error_file_data=data)

    def rank_failure(self, node_index: int) -> RankFailure:
        return RankFailure(rank=self.rank, local_rank=self.local_rank, node_index=node_index, host=self.host,
                           pid=self.pid, exc_type=describe_exit_code(self.exitcode), message=NO_EXCEPTION,
                           traceback="", timestamp=self.timestamp)

    @classmethod
    def from_file(cls, data: Any) -> Optional["AgentFailure"]:
        """None for anything but a whole record (a file is never trusted blindly)."""
        if not isinstance(data, dict):
            return None
        numbers: Dict[str, Any] = {k: data.get(k) for k in ("rank", "local_rank", "pid", "exitcode")}
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in numbers.values()) \
                or not isinstance(data.get("timestamp"), (int, float)) or not isinstance(data.get("host"), str):
            return None
        signal_name, error_file, extra = data.get("signal"), data.get("error_file"), data.get("error_file_data")
        return cls(**numbers, signal=signal_name if isinstance(signal_name, str) else None,
                   timestamp=float(data["timestamp"]), host=data["host"],
                   error_file=error_file if isinstance(error_file, str) else None,
                   error_file_data=extra if isinstance(extra, dict) else {})


def write_agent_failures(directory: str, failures: List[AgentFailure]) -> None:
    write_json(os.path.join(directory, AGENT_FAILURES_FILE), [asdict(f) for f in failures])


def read_agent_failures(directory: str, node_index: int) -> List[RankFailure]:
    data = read_json(os.path.join(directory, AGENT_FAILURES_FILE))
    found = {}
    for item in data if isinstance(data, list) else []:
        record = AgentFailure.from_file(item)
        if record is not None:
            found[record.rank] = record.rank_failure(node_index)
    return sorted(found.values(), key=lambda f: f.timestamp)


def with_last_output(failure: RankFailure, lines: List[str]) -> RankFailure:
    """A rank killed by a signal left no traceback: what it wrote last (a crash
    dump, C++'s "terminate called", a CUDA assert) usually names the cause."""
    if failure.traceback:
        return failure
    shown = crash_output(lines)
    if not shown:
        return failure
    return replace(failure, traceback="The rank's last lines of stderr:\n%s" % "\n".join(shown))


def crash_output(lines: List[str]) -> List[str]:
    """From just before "Fatal Python error" (where C++ prints what it threw), the crashing thread's stack
    first; else the last lines."""
    lines = [line for line in lines if not line.startswith("Extension modules:")]
    start = max(0, len(lines) - OUTPUT_LINES)
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Fatal Python error"):
            start = max(0, i - CONTEXT_LINES)
            lines = lines[:i + 1] + current_thread_first(lines[i + 1:])
            break
    return lines[start:start + MAX_OUTPUT_LINES]


def current_thread_first(dump: List[str]) -> List[str]:
    """faulthandler's thread blocks with the crashing one ("Current thread") first: the others (a library's,
    ours, a data loader's) wait where they always wait, and came first pushed it out of the lines shown."""
    blocks: List[List[str]] = [[]]
    for line in dump:
        if line.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append([])
        blocks[-1].append(line)
    current = [b for b in blocks[1:] if b[0].startswith("Current thread")]
    others = [b for b in blocks[1:] if not b[0].startswith("Current thread")]
    return [line for block in [blocks[0]] + current + others for line in block]


def merge_failures(recorded: List[RankFailure], reported: List[RankFailure]) -> List[RankFailure]:
    """A rank's own record (with its traceback) wins over torchrun's report of it."""
    ranks = {f.rank for f in recorded}
    return root_cause_order(recorded + [f for f in reported if f.rank not in ranks])


# What a start of the ranks leaves that would be read as the next start's.
_ROUND_SUFFIXES = (FAILURE_SUFFIX, STACKS_SUFFIX, RETURN_SUFFIX, EXCEPTION_SUFFIX)


def clear_round(directory: str) -> None:
    """Before an in-step restart, so the new ranks' records are the only ones read."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for name in entries:
        if name == AGENT_FAILURES_FILE or any(rank_of(name, s) is not None for s in _ROUND_SUFFIXES):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass
