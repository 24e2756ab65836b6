"""Failure types users see.

Every error a user can hit is a ``MetaflowException`` so Metaflow prints it as a
clean one-paragraph message instead of a traceback from inside the launcher.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any, Iterable, List, Optional

from . import load_order  # noqa: F401  (Metaflow first, whatever the user imports first)
from metaflow.exception import MetaflowException

from .cause import CauseKind
from .procs import RankFailure, describe_exit_code, root_cause_order

if TYPE_CHECKING:
    from .cause import Cause

# How much of another node's traceback a stopped node's error shows.
TRACEBACK_LINES = 30


def shown(value: Any) -> str:
    """``repr(value)`` for a message about a value a user gave, never an error of
    its own (a ``__repr__`` that raises, an int too long for ``str``) in place of
    the refusal it belongs to."""
    try:
        text = repr(value)
    except Exception as e:  # a user's type, or int's digit limit
        if isinstance(value, int):
            return "an integer of about %d digits" % int(value.bit_length() * 0.30103 + 1)
        return "<a %s whose repr() fails: %s>" % (type(value).__name__, type(e).__name__)
    return text if isinstance(text, str) else "<a %s>" % type(value).__name__


def did_you_mean(word: str, choices: Iterable[str], quote: str = "%r") -> str:
    """`` (did you mean 'x'?)`` for a near miss, else ``""``: a typo is fixed
    from the message, without a trip to the docs. ``choices`` is bounded by
    the caller (a directory listing is cut, not read whole)."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return " (did you mean %s?)" % (quote % close[0]) if close else ""


class TorchrunException(MetaflowException):
    headline = "@torchrun error"


class TorchrunInvalidArgument(TorchrunException):
    """A value given to ``@torchrun`` or ``current.torch.run`` cannot be used."""

    headline = "@torchrun: invalid argument"


class TorchrunCallRefused(TorchrunInvalidArgument):
    """A ``current.torch.run`` call whose arguments were refused: nothing
    started on this node. Its message names the call and where the step's
    code made it, and no traceback of ours goes with it (the fix is in the
    user's line, not in ours)."""

    def __init__(self, call: int, where: Optional[str], problem: str, api: str = "current.torch.run"):
        self.call = call  # 1-based, as the message says it
        self.where = where
        self.problem = problem
        super().__init__("%s call %d%s: %s" % (api, call, " (%s)" % where if where else "", problem))


# Causes a stopped node's error names as "node N failed first", with its traceback.
_FAILED_FIRST = (CauseKind.RANK_FAILED, CauseKind.STEP_FAILED)


def is_refusal(cause: "Cause") -> bool:
    """A gang's cause that is a refused call: every node's log then needs the
    problem once, not a traceback."""
    return cause.exc_type == TorchrunCallRefused.__name__


class TorchrunMissingDependency(TorchrunInvalidArgument):
    """This task's Python cannot run torchrun: no torch, no torch.distributed,
    or a torch whose torchrun lacks an option we pass."""

    headline = "@torchrun: missing dependency"


class TorchrunNotRetried(TorchrunException):
    """``retry_on="infrastructure"``: the previous attempt failed in the user's
    code, so this attempt does not run."""

    headline = "@torchrun: not retried"


class TorchrunFailed(TorchrunException):
    """torchrun on this node ended unsuccessfully."""

    headline = "@torchrun job failed"

    def __init__(
        self,
        exit_code: int,
        node_index: int,
        failures: Optional[List[RankFailure]] = None,
        command: Optional[List[str]] = None,
    ):
        self.exit_code = exit_code
        self.node_index = node_index
        self.failures = root_cause_order(list(failures or []))
        self.root_cause = self.failures[0] if self.failures else None
        self.command = command
        lines = [
            "torchrun on node %d ended with %s."
            % (node_index, describe_exit_code(exit_code))
        ]
        if self.root_cause is not None:
            lines.append("First failure: %s" % self.root_cause.summary())
            if self.root_cause.traceback:
                lines.append(self.root_cause.traceback.rstrip())
            others = self.failures[1:]
            if others:
                lines.append(
                    "Also failed: %s"
                    % ", ".join("rank %d" % f.rank for f in others)
                )
        else:
            lines.append(
                "No rank recorded a Python exception (a rank may have been killed by a "
                "signal, or torchrun itself failed); see the log above."
            )
        super().__init__("\n".join(lines))


class GangAborted(TorchrunException):
    """This node stopped because the gang failed elsewhere (a node's step or
    ranks failed, a node went silent or never joined)."""

    headline = "@torchrun gang stopped"

    def __init__(self, node_index: int, cause: "Cause", own_exit_code: Optional[int] = None,
                 same_log: bool = False):
        self.node_index = node_index
        self.cause = cause
        origin = cause.node_index
        if same_log and is_refusal(cause):
            # A local run: every node's output is the control's log, where the
            # refusing node's own error says the problem once.
            text = "node %d stopped because node %s refused its current.torch.run call (its error is in this log)." % (
                node_index, origin if origin is not None else "?")
        elif origin is not None and origin != node_index and cause.kind in _FAILED_FIRST:
            text = "node %d stopped because node %d failed first: %s" % (node_index, origin, cause.summary)
            if cause.traceback:
                lines = cause.traceback.rstrip().splitlines()
                shown = lines[-TRACEBACK_LINES:]
                text += "\nNode %d's traceback%s:\n%s" % (
                    origin, " (last %d lines)" % len(shown) if len(lines) > len(shown) else "",
                    "\n".join(shown))
        else:
            text = "node %d stopped: %s" % (node_index, cause.summary)
        if cause.kind is CauseKind.PREFLIGHT and cause.message:
            text += "\n" + cause.message  # every field and node, and the fix
        super().__init__(text)


class TorchrunInterrupted(TorchrunException):
    """The step was asked to stop (SIGTERM, Ctrl-C, ``@timeout``, a spot
    notice) while torchrun was running: the whole gang was stopped gracefully."""

    headline = "@torchrun interrupted"


def raise_all(problems: List[str]) -> None:
    """One run, every problem: a flow with several mistakes is refused once,
    naming each, rather than once per run (on AWS Batch, once per job)."""
    problems = [p for p in problems if p]
    if len(problems) == 1:
        raise TorchrunInvalidArgument(problems[0])
    if problems:
        raise TorchrunInvalidArgument(
            "%d problems:\n%s" % (len(problems), "\n".join("- " + p for p in problems))
        )


class Problems:
    """Collects ``TorchrunInvalidArgument`` messages from several checks, so
    that every one of them runs before the step is refused."""

    def __init__(self) -> None:
        self.messages: List[str] = []

    def check(self, func, *args, **kwargs):
        """``func(*args, **kwargs)``, or None with its message kept."""
        try:
            return func(*args, **kwargs)
        except TorchrunInvalidArgument as e:
            self.messages.extend(_split(e.message))
            return None

    def __enter__(self) -> "Problems":
        return self

    def __exit__(self, kind: Any, error: Any, tb: Any) -> bool:
        """``with problems: value = check(...)``: a refusal in the block is kept
        and the code after it runs on. The block calls its checks itself, so a
        planner's checks are never called back from this lower layer."""
        if isinstance(error, TorchrunInvalidArgument):
            self.messages.extend(_split(error.message))
            return True
        return False

    def add(self, message: str) -> None:
        self.messages.append(message)

    def raise_all(self) -> None:
        raise_all(self.messages)


def _split(message: str) -> List[str]:
    """A message from ``raise_all`` holds several problems: keep them apart."""
    lines = message.splitlines()
    if lines and lines[0].endswith(" problems:") and all(l.startswith("- ") for l in lines[1:]):
        return [l[2:] for l in lines[1:]]
    return [message]
