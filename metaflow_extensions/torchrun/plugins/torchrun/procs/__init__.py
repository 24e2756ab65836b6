"""What runs in the processes torchrun starts: its agent and every rank.

Ranks import this, so it imports no Metaflow and loads its names on first use.
``names`` is the one home of every name the task and the ranks share
(environment variables, per-rank file names); ``bootstrap`` runs first in every
rank; ``agent`` runs torchrun's agent; ``stacks``, ``failures`` and ``exits``
are what a rank leaves behind for the task to read; ``report`` (``progress``)
is what a training loop calls each step.

Usage (the task reads what the ranks wrote)::

    failures = read_failures(workdir)
    print(stacks.summarize(collected))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base.lazy import names_from

__all__ = [
    "zygote_log_path",
    "ZYGOTE_SOCKET",
    "ZYGOTE_ENV",
    "HOST_ZYGOTE_ENV",
    "ZYGOTE_NAME",
    "ZYGOTE_PID_SUFFIX",
    "ARGS_FILE",
    "Culprits",
    "FlightError",
    "FlightSummary",
    "MAX_METRICS",
    "MAX_STACK_BYTES",
    "NO_EXCEPTION",
    "ProgressReport",
    "RankFailure",
    "RankStatus",
    "RunningRank",
    "running_ranks",
    "SUMMARY_PLACES",
    "StatusError",
    "bound",
    "clear_round",
    "RESTART_ENV",
    "clean_metrics",
    "describe_exit_code",
    "find_culprits",
    "unread_reason",
    "group",
    "merge_failures",
    "numbers",
    "rank_log_path",
    "read_agent_failures",
    "read_progress",
    "read_failures",
    "read_statuses",
    "root_cause_order",
    "with_last_output",
    "report",
]

# Where each name lives: loaded on first use, so that importing the face costs nothing.
_HOME = {
    "zygote_log_path": "names",
    "ZYGOTE_SOCKET": "names",
    "ZYGOTE_ENV": "names",
    "HOST_ZYGOTE_ENV": "names",
    "ZYGOTE_NAME": "names",
    "ZYGOTE_PID_SUFFIX": "names",
    "ARGS_FILE": "names",
    "Culprits": "culprit",
    "FlightError": "flight",
    "FlightSummary": "flight",
    "MAX_METRICS": "progress",
    "MAX_STACK_BYTES": "stacks",
    "NO_EXCEPTION": "failures",
    "ProgressReport": "progress",
    "RankFailure": "failures",
    "RankStatus": "status",
    "RunningRank": "running",
    "running_ranks": "running",
    "SUMMARY_PLACES": "stacks",
    "StatusError": "status",
    "bound": "stacks",
    "clear_round": "failures",
    "RESTART_ENV": "names",
    "clean_metrics": "progress",
    "describe_exit_code": "failures",
    "find_culprits": "culprit",
    "unread_reason": "culprit",
    "group": "stacks",
    "merge_failures": "failures",
    "numbers": "ranges",
    "rank_log_path": "names",
    "read_agent_failures": "failures",
    "read_progress": "progress",
    "read_failures": "failures",
    "read_statuses": "status",
    "report": "progress",
    "root_cause_order": "failures",
    "with_last_output": "failures",
}

if TYPE_CHECKING:
    from .culprit import Culprits, find_culprits, unread_reason
    from .flight import FlightError, FlightSummary
    from .failures import NO_EXCEPTION, RankFailure, clear_round, describe_exit_code, merge_failures, read_agent_failures, read_failures, root_cause_order, with_last_output
    from .progress import MAX_METRICS, ProgressReport, clean_metrics, read_progress, report
    from .names import RESTART_ENV, ARGS_FILE, rank_log_path
    from .names import (HOST_ZYGOTE_ENV, ZYGOTE_ENV, ZYGOTE_NAME, ZYGOTE_PID_SUFFIX, ZYGOTE_SOCKET,
                        zygote_log_path)
    from .ranges import numbers
    from .stacks import MAX_STACK_BYTES, SUMMARY_PLACES, bound, group
    from .running import RunningRank, running_ranks
    from .status import RankStatus, StatusError, read_statuses


__getattr__ = names_from(__name__, _HOME)
