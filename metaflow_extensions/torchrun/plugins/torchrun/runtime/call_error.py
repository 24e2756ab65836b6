"""The one place where a failed call's exception is chosen: ``call_error`` takes the call's
outcome on this node (``CallOutcome``: the gang's verdict, this node's ranks' failures, what
the failure screen shows) and returns what ``current.torch.run`` raises, carrying the call's
result, its message made once (with a hint where a rank's argparse refused a key given ``True``).
Pure: what it is given was read and gathered before (runtime/call_failure.py), so every case is
a unit test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..cause import Cause, CauseKind
from ..errors import GangAborted, TorchrunFailed, TorchrunInterrupted, not_restarted, rank_raised
from ..launch.command import argparse_hint
from ..procs.failures import RankFailure, root_cause_order
from ..record.result import TorchrunResult


@dataclass(frozen=True)
class CallOutcome:
    """A call that did not end well, as this node knows it when it raises."""

    node_index: int
    cause: Cause  # the gang's verdict, else this node's own cause
    exit_code: Optional[int] = None  # this node's torchrun agent (None: no ranks ran here)
    failures: Tuple[RankFailure, ...] = ()  # this node's failed ranks, as their records say
    command: Tuple[str, ...] = ()
    same_log: bool = False  # a local run: every node's error goes to one log, the root cause's says it whole
    host: str = ""
    # What the failure screen shows besides the cause (the nodes that speak for the failure have them).
    stacks: Dict[int, str] = field(default_factory=dict)
    logs: str = ""
    elsewhere: Tuple[int, ...] = ()  # the other nodes' failed ranks
    suspects: Tuple[str, ...] = ()
    started: bool = True  # some rank of the call had started: on any node (``sees_gang``), else on this one
    sees_gang: bool = False  # the control, which has every node's report
    # A function entrypoint's own exception, raised by the failing rank of this node (read from its file).
    rank_exception: Optional[BaseException] = None


def own_rank_failed(outcome: CallOutcome) -> bool:
    """Whether the gang's root cause is this node's own rank."""
    return outcome.cause.kind is CauseKind.RANK_FAILED and outcome.cause.node_index == outcome.node_index


def call_error(outcome: CallOutcome, result: Optional[TorchrunResult] = None,
               true_keys: Sequence[str] = ()) -> BaseException:
    """The exception ``current.torch.run`` raises, with the call's ``result`` (``err.result``): this node's
    rank failed first, ``TorchrunFailed`` (of the user's exception type for a function's rank); this node
    was told to stop (preempted), ``TorchrunInterrupted``; else the gang stopped for another reason or
    node, ``GangAborted``. ``true_keys``: the call's entrypoint_args given ``True`` (``CallPlan.true_keys``)."""
    cause = outcome.cause
    # Why @torchrun(restarts=N) let it fail, where N was set.
    refused = not_restarted(cause, result.restarts_allowed, result.restarts) if result is not None else ""
    hint = true_flag_hint(outcome, true_keys) or start_hint(outcome)
    if own_rank_failed(outcome):
        error = TorchrunFailed(outcome.exit_code if outcome.exit_code is not None else -1, outcome.node_index,
                               list(outcome.failures), list(outcome.command), stacks=outcome.stacks,
                               logs=outcome.logs, host=outcome.host, elsewhere=outcome.elsewhere, result=result,
                               refused_restart=refused, hint=hint)
        return rank_raised(outcome.rank_exception, error) if outcome.rank_exception is not None else error
    if cause.kind is CauseKind.PREEMPTED and cause.node_index == outcome.node_index:
        # Told to stop, not failed: the gang saved (stop.py).
        return TorchrunInterrupted(cause.summary + ".", result=result)
    return GangAborted(outcome.node_index, cause, outcome.exit_code, same_log=outcome.same_log,
                       stacks=outcome.stacks, logs=outcome.logs, elsewhere=list(outcome.elsewhere),
                       suspects=list(outcome.suspects), result=result, refused_restart=refused, hint=hint)


def true_flag_hint(outcome: CallOutcome, true_keys: Sequence[str]) -> str:
    """What metaflow-torchrun 0.2 passed for a key given ``True`` (a bare flag now), where a rank's argparse
    wanted a value for it: read in what the error shows (the ranks' failures, the gang's cause, the
    output); "" where no rank refused one."""
    if not true_keys:
        return ""
    cause = outcome.cause
    shown = [outcome.logs, *outcome.stacks.values(), *outcome.suspects, cause.summary, cause.message or "",
             cause.traceback or ""]
    shown += ["%s\n%s" % (f.message, f.traceback) for f in outcome.failures]
    return argparse_hint("\n".join(shown), true_keys) or ""


def start_hint(outcome: CallOutcome) -> str:
    """Why a hang verdict shows no stacks: it came before any rank ran, and the ranks' start counts."""
    if outcome.started or outcome.cause.kind is not CauseKind.HANG:
        return ""
    which = "" if outcome.sees_gang else " of node %d" % outcome.node_index
    return ("No rank%s had started yet: hang_timeout counts from the moment every node reached the call, "
            "so the ranks' imports and torchrun's rendezvous count. Set it above the time they take to start."
            % which)


def failing_rank(failures: List[RankFailure]) -> Optional[int]:
    """The rank whose failure ``TorchrunFailed`` names first (its root cause), where one failed."""
    ordered = root_cause_order(list(failures))
    return ordered[0].rank if ordered else None
