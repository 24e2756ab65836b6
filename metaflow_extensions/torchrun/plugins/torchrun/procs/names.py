"""Every name the task and the ranks share (environment variables, the files of
a call's work directory), in one home so writer and reader never drift apart.
Imports nothing: ranks load it before anything else.
"""

from __future__ import annotations

import os
TYPE_CHECKING = False  # typing unimported: a stand-in loads this before it hands off (handoff.py)
if TYPE_CHECKING:
    from typing import Optional

# What the task sets for its torchrun and ranks (users' settings: base/knobs.py).
WORK_DIR_ENV = "METAFLOW_TORCHRUN_WORK_DIR"  # the call's work directory
NODE_INDEX_ENV = "METAFLOW_TORCHRUN_NODE_INDEX"
LABELS_ENV = "METAFLOW_TORCHRUN_LABELS"  # "0": leave output lines as they are
LOG_DIR_ENV = "METAFLOW_TORCHRUN_LOG_DIR"  # per-rank copies of stdout and stderr
ENTRY_ENV = "METAFLOW_TORCHRUN_ENTRY"  # the entry file's path
USER_TMPDIR_ENV = "METAFLOW_TORCHRUN_USER_TMPDIR"  # the ranks' TMPDIR ("": none)
USER_UMASK_ENV = "METAFLOW_TORCHRUN_USER_UMASK"  # the ranks' umask, in octal (torchrun's agent runs under 077)
# Which restart of the call's ranks this is: the bootstrap sets torch's count from it.
RESTART_ENV = "METAFLOW_TORCHRUN_RESTART"
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
ZYGOTE_ENV = "METAFLOW_TORCHRUN_ZYGOTE"  # the warm process's socket (zygote.py); unset: start fresh
# A local run's control's warm process: the host's other nodes fork theirs from it.
HOST_ZYGOTE_ENV = "METAFLOW_TORCHRUN_HOST_ZYGOTE"
SNAPSHOT_ENV = "METAFLOW_TORCHRUN_SNAPSHOT"  # the node's snapshot store's socket (snapshots/node/store.py)
# @torchrun(snapshots=N): the trainers' callbacks snapshot every N steps ("" or "0": chosen from a save's cost).
SNAPSHOT_EVERY_ENV = "METAFLOW_TORCHRUN_SNAPSHOT_EVERY"
# Under @torchrun with no store (SNAPSHOT_ENV unset): why, for the one line a rank says of it.
SNAPSHOTS_OFF_ENV = "METAFLOW_TORCHRUN_SNAPSHOTS_OFF"
OFF_BY_SETTING = "setting"  # @torchrun(snapshots=False)
OFF_NO_RESTARTS = "restarts"  # restarts=0: a snapshot serves an in-step restart only
OFF_ON_NODE = "node"  # the node's store could not start (the task said why)
# A warm process's comm: a supervisor does not count another node's, forked from its own, as its own.
ZYGOTE_NAME = b"mftr-zygote"
# torch's own, set by the plan.
SHARE_STORE_OFF_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
# torch's Flight Recorder's size in entries (0: off), and its older name; a user's own value wins.
FR_BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
FR_BUFFER_OLD_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
# Where torch writes the recorder's dumps: 2.15's name, and the older one.
FR_DUMP_ENV = "TORCH_FR_DUMP_TEMP_FILE"
FR_DUMP_OLD_ENV = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"

# -- files of one call's work directory (host/workdirs.py makes the directory) ----
ENTRY_FILE = "entry.json"  # what every rank runs (procs/entry.py)
AGENT_TMP = "tmp"  # torchrun's agent's TMPDIR (its own directories)
ARGS_FILE = "function-args.pkl"  # a function's arguments (procs/functions.py)
RANK_PREFIX = "rank-"
FAILURE_SUFFIX = ".failure.json"  # a rank's failure record (procs/failures.py)
STATUS_SUFFIX = ".status.json"  # a rank's start and exit (procs/status.py)
AGENT_FAILURES_FILE = "agent-failures.json"  # the ranks torch's agent saw fail (procs/agent.py)
RETURN_SUFFIX = ".return.pkl"  # a function's return value
EXCEPTION_SUFFIX = ".exception.pkl"  # a function's exception
STACKS_SUFFIX = ".stacks.txt"  # where a rank was when stopped (procs/stacks.py)
PROGRESS_SUFFIX = ".progress.json"  # a rank's latest progress report (procs/rank_progress.py)
FLIGHT_ASK_SUFFIX = ".flight.fifo"  # where the node asks a rank for its Flight Recorder (procs/flight_ask.py)
FLIGHT_SUFFIX = ".flight.json"  # and where the rank answers
ARRIVALS_SUFFIX = ".arrivals.json"  # when the rank reached its latest collectives (procs/arrivals.py)
LOG_SUFFIX = ".log"  # rank-<R>.<stream>.log in the call's log directory
ZYGOTE_SOCKET = "zygote.sock"  # the warm process's socket (procs/zygote.py)
ZYGOTE_PID_SUFFIX = ".pid"  # beside it: the pid of a warm process forked from the host's


def rank_file(directory: str, rank: int, suffix: str) -> str:
    return os.path.join(directory, "%s%d%s" % (RANK_PREFIX, rank, suffix))


def rank_of(name: str, suffix: str) -> Optional[int]:
    """None for any other name; a rank that could not read its number wrote -1."""
    if not (name.startswith(RANK_PREFIX) and name.endswith(suffix)):
        return None
    number = name[len(RANK_PREFIX):len(name) - len(suffix)]
    digits = number[1:] if number.startswith("-") else number
    return int(number) if digits.isdigit() and digits.isascii() else None


def agent_log_path(log_dir: str) -> str:
    return os.path.join(log_dir, "torchrun-agent.log")


def zygote_log_path(log_dir: str) -> str:
    return os.path.join(log_dir, "zygote.log")


def rank_log_path(log_dir: str, rank: int, stream: str) -> str:
    return rank_file(log_dir, rank, ".%s%s" % (stream, LOG_SUFFIX))
