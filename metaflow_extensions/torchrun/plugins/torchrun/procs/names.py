"""Every name the task and the ranks share: environment variables and the
files of a call's work directory.

One home, so that the side that writes a name and the side that reads it can
never drift apart. It lives in ``procs/`` (the layer both sides may import) and
imports nothing: ranks load it before anything else.
"""

from __future__ import annotations

import os
from typing import Optional

# -- environment: what users set ------------------------------------------------
# The METAFLOW_TORCHRUN_* settings live in ../knobs.py, read once at the step's
# start; what reaches the ranks comes in their entry file (entry.py).

# -- environment: what the task sets for its torchrun and ranks -------------------
WORK_DIR_ENV = "METAFLOW_TORCHRUN_WORK_DIR"  # the call's work directory
NODE_INDEX_ENV = "METAFLOW_TORCHRUN_NODE_INDEX"
LABELS_ENV = "METAFLOW_TORCHRUN_LABELS"  # "0": leave output lines as they are
LOG_DIR_ENV = "METAFLOW_TORCHRUN_LOG_DIR"  # per-rank copies of stdout and stderr
ENTRY_ENV = "METAFLOW_TORCHRUN_ENTRY"  # the entry file's path
USER_TMPDIR_ENV = "METAFLOW_TORCHRUN_USER_TMPDIR"  # the ranks' TMPDIR ("": none)
USER_UMASK_ENV = "METAFLOW_TORCHRUN_USER_UMASK"  # the ranks' umask, in octal (torchrun's agent runs under 077)
# Which restart of the call's ranks this is (@torchrun(restarts)): the bootstrap
# sets torch's own TORCHELASTIC_RESTART_COUNT from it (a fresh agent says 0).
RESTART_ENV = "METAFLOW_TORCHRUN_RESTART"
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
# The node's warm process's socket (procs/zygote.py): torchrun's agent and the
# ranks hand their start to it (procs/handoff.py). Unset: they start fresh.
ZYGOTE_ENV = "METAFLOW_TORCHRUN_ZYGOTE"
# A local run's control's warm process, for the other nodes Metaflow starts on
# the same host: each node's own warm process is forked from it, so the host
# imports torch once (runtime/warm_start.py).
HOST_ZYGOTE_ENV = "METAFLOW_TORCHRUN_HOST_ZYGOTE"
# What ps and /proc/PID/comm show for a warm process: a node's supervisor does
# not count another node's warm process, forked from its own, as its own.
ZYGOTE_NAME = b"mftr-zygote"
# torch's own, set by the plan.
SHARE_STORE_OFF_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
# torch's Flight Recorder's size in entries (0: off), and its older name, which
# torch reads when the first is unset. A user's own value of either wins.
FR_BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
FR_BUFFER_OLD_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
# The path prefix torch writes the recorder's dumps under: 2.15's name, and the
# older one that torch before 2.15 reads (record/evidence.py looks under both).
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
PROGRESS_SUFFIX = ".progress.json"  # a rank's latest progress report (procs/progress.py)
FLIGHT_ASK_SUFFIX = ".flight.fifo"  # where the node asks a rank for its Flight Recorder (procs/flight_ask.py)
FLIGHT_SUFFIX = ".flight.json"  # and where the rank answers
LOG_SUFFIX = ".log"  # rank-<R>.<stream>.log in the call's log directory
ZYGOTE_SOCKET = "zygote.sock"  # the warm process's socket (procs/zygote.py)
ZYGOTE_PID_SUFFIX = ".pid"  # beside it: the pid of a warm process forked from the host's


def rank_file(directory: str, rank: int, suffix: str) -> str:
    return os.path.join(directory, "%s%d%s" % (RANK_PREFIX, rank, suffix))


def rank_of(name: str, suffix: str) -> Optional[int]:
    """The rank in a file name ``rank-<R><suffix>``; None for any other name.
    A rank that could not read its own number records itself as -1."""
    if not (name.startswith(RANK_PREFIX) and name.endswith(suffix)):
        return None
    number = name[len(RANK_PREFIX):len(name) - len(suffix)]
    digits = number[1:] if number.startswith("-") else number
    return int(number) if digits.isdigit() and digits.isascii() else None


def agent_log_path(log_dir: str) -> str:
    """Where torchrun's agent logs on this node (its own W/E lines and its
    report of a failure): kept out of the console, where our root cause leads."""
    return os.path.join(log_dir, "torchrun-agent.log")


def zygote_log_path(log_dir: str) -> str:
    """What the node's warm process itself says (torch's import warnings)."""
    return os.path.join(log_dir, "zygote.log")


def rank_log_path(log_dir: str, rank: int, stream: str) -> str:
    """Where the relay copies one rank's ``stdout`` or ``stderr``."""
    return rank_file(log_dir, rank, ".%s%s" % (stream, LOG_SUFFIX))
