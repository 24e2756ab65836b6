"""What runs in the processes torchrun starts: its agent and every rank.

Ranks import this, so it imports no Metaflow and loads its names on first use.
"""

from __future__ import annotations

from ..base.lazy import names_from

TYPE_CHECKING = False  # typing unimported: a stand-in loads this package before it hands off (handoff.py)

__all__ = [
    "zygote_log_path", "ZYGOTE_SOCKET", "ZYGOTE_ENV", "HOST_ZYGOTE_ENV", "ZYGOTE_NAME", "ZYGOTE_PID_SUFFIX",
    "ARGS_FILE", "Culprits", "FlightError", "FlightSummary", "MAX_METRICS", "MAX_STACK_BYTES", "NO_EXCEPTION",
    "ProgressReport", "RankFailure", "RankStatus", "RunningRank", "running_ranks", "SUMMARY_PLACES",
    "StatusError", "bound", "clear_round", "RESTART_ENV", "clean_metrics", "describe_exit_code", "find_culprits",
    "unread_reason", "group", "merge_failures", "numbers", "rank_log_path", "read_agent_failures",
    "read_progress", "read_failures", "read_statuses", "root_cause_order", "with_last_output", "report",
]

# Where each name lives: loaded on first use, so that importing the face costs nothing.
_MODULES = {
    "names": ("zygote_log_path", "ZYGOTE_SOCKET", "ZYGOTE_ENV", "HOST_ZYGOTE_ENV", "ZYGOTE_NAME",
              "ZYGOTE_PID_SUFFIX", "ARGS_FILE", "RESTART_ENV", "rank_log_path"),
    "culprit": ("Culprits", "find_culprits", "unread_reason"),
    "flight": ("FlightError", "FlightSummary"),
    "rank_progress": ("MAX_METRICS", "ProgressReport", "clean_metrics", "read_progress", "report"),
    "stacks": ("MAX_STACK_BYTES", "SUMMARY_PLACES", "bound", "group"),
    "failures": ("NO_EXCEPTION", "RankFailure", "clear_round", "describe_exit_code", "merge_failures",
                 "read_agent_failures", "read_failures", "root_cause_order", "with_last_output"),
    "status": ("RankStatus", "StatusError", "read_statuses"),
    "running": ("RunningRank", "running_ranks"),
    "ranges": ("numbers",),
}

if TYPE_CHECKING:
    from .culprit import Culprits, find_culprits, unread_reason
    from .flight import FlightError, FlightSummary
    from .failures import (NO_EXCEPTION, RankFailure, clear_round, describe_exit_code, merge_failures,
                           read_agent_failures, read_failures, root_cause_order, with_last_output)
    from .rank_progress import MAX_METRICS, ProgressReport, clean_metrics, read_progress, report
    from .names import RESTART_ENV, ARGS_FILE, rank_log_path
    from .names import (HOST_ZYGOTE_ENV, ZYGOTE_ENV, ZYGOTE_NAME, ZYGOTE_PID_SUFFIX, ZYGOTE_SOCKET,
                        zygote_log_path)
    from .ranges import numbers
    from .stacks import MAX_STACK_BYTES, SUMMARY_PLACES, bound, group
    from .running import RunningRank, running_ranks
    from .status import RankStatus, StatusError, read_statuses


__getattr__ = names_from(__name__, {name: module for module, names in _MODULES.items() for name in names})
