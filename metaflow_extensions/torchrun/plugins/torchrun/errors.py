"""Failure types users see: each a ``MetaflowException``, which Metaflow prints as a message, not a
traceback from inside the launcher."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence

from . import load_order  # noqa: F401  (Metaflow first, whatever the user imports first)
from metaflow.exception import MetaflowException

from .base.text import first_line

if TYPE_CHECKING:  # `import metaflow` exports these errors: what renders one loads as it is raised
    from .cause import Cause
    from .procs.failures import RankFailure

# Where every rank's full stack is, as a failure message says it.
FULL_REPORT = "the card, and the artifact torchrun_report of node 0's task"


def shown(value: Any) -> str:
    """``repr(value)`` for a refusal's message, never an error of its own in its place."""
    try:
        text = repr(value)
    except Exception as e:  # a user's type, or int's digit limit
        if isinstance(value, int):
            return "an integer of about %d digits" % int(value.bit_length() * 0.30103 + 1)
        return "<a %s whose repr() fails: %s>" % (type(value).__name__, type(e).__name__)
    return text if isinstance(text, str) else "<a %s>" % type(value).__name__


def did_you_mean(word: str, choices: Iterable[str], quote: str = "%r") -> str:
    """`` (did you mean 'x'?)`` for a near miss, else ``""`` (``choices`` bounded by the caller)."""
    import difflib  # here, not at the top: `import metaflow` loads this module, and a near miss is rare

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return " (did you mean %s?)" % (quote % close[0]) if close else ""


class TorchrunException(MetaflowException):
    headline = "@torchrun error"

    def __init__(self, msg: str = "", lineno: Optional[int] = None, result: Optional[object] = None):
        super().__init__(msg, lineno)
        # A failed call's ``TorchrunResult`` (record/result.py, a layer above), given as the error is made.
        self.result = result


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


# The head of a local node's last lines when its task ended before it joined (gang/membership.py).
LAST_LINES_HEAD = "its last lines of output:"


def is_refusal(cause: "Cause") -> bool:
    """A refused call: every node's log needs the problem once, not a traceback."""
    return cause.exc_type == TorchrunCallRefused.__name__


class TorchrunMissingDependency(TorchrunInvalidArgument):
    """This task's Python cannot run torchrun: no torch, no torch.distributed,
    or a torch whose torchrun lacks an option we pass."""

    headline = "@torchrun: missing dependency"


class TorchrunNotRetried(TorchrunException):
    """``retry_on="infrastructure"``: the previous attempt failed in the user's
    code, so this attempt does not run."""

    headline = "@torchrun: not retried"


def not_restarted(cause: Optional["Cause"], allowed: int, used: int) -> str:
    """Why ``@torchrun(restarts=N)`` did not restart the ranks after ``cause``, as the gang decides it
    (``gang/calls.py`` ``may_restart``), for the failure screen and the card; "" without N or a cause."""
    from .cause import CauseKind, restartable_in_step, user_code_failure

    if cause is None or allowed <= 0 or cause.kind in (CauseKind.PREEMPTED, CauseKind.INTERRUPTED):
        return ""
    asked = "@torchrun(restarts=%d)" % allowed
    code = user_code_failure(cause)
    if code is not None and cause.kind is not CauseKind.HANG:
        what = "a Python exception of your code (%s) would raise again" % code if cause.exc_type else \
            "%s is your code's and would happen again" % code
        return "not restarted: %s, and %s restarts only infrastructure failures" % (what, asked)
    if used >= allowed:
        return "not restarted: %s used all %d of its restarts" % (asked, allowed)
    if not restartable_in_step(cause):
        return ("not restarted: %s restarts the ranks only while every node's task is alive (a rank killed or "
                "failed, a NCCL/gloo error, a hang), and this was %s" % (asked, cause.kind.value.replace("_", " ")))
    return "not restarted: a node was done with the call, or its failure came before every node reached it"


def _clause(text: str) -> str:
    return text[:1].upper() + text[1:] + "." if text else ""


def _with_hint(message: str, hint: str) -> str:
    """A failure's message and, last, a ``hint`` at its fix (runtime/call_error.py's), when there is one."""
    return "%s\n\n%s" % (message, hint) if hint else message


class TorchrunFailed(TorchrunException):
    """torchrun on this node ended unsuccessfully. Its message is the failure
    block (``procs/failure_block.py``): the failing rank's traceback once, the
    user's frames only, then the echoes, where the ranks were, the logs, a fix."""

    headline = "@torchrun job failed"

    def __init__(self, exit_code: int, node_index: int, failures: Optional[List[RankFailure]] = None,
                 command: Optional[List[str]] = None, stacks: Optional[Dict[int, str]] = None, logs: str = "",
                 host: str = "", elsewhere: Sequence[int] = (), suspects: Sequence[str] = (),
                 result: Optional[object] = None, refused_restart: str = "", hint: str = ""):
        from .procs.failures import describe_exit_code, root_cause_order
        from .procs import failure_block

        self.exit_code = exit_code
        self.node_index = node_index
        self.failures = root_cause_order(list(failures or []))
        self.root_cause = self.failures[0] if self.failures else None
        self.command = command
        root = self.root_cause
        if root is not None:
            head = "First failure: %s" % first_failure(root, host or root.host)
        else:
            head = ("torchrun on node %d ended with %s; no rank recorded a Python exception (a rank may have "
                    "been killed by a signal, or torchrun itself failed)."
                    % (node_index, describe_exit_code(exit_code)))
        if refused_restart:  # under the cause's line, before its traceback: the first lines say both
            head += "\n" + _clause(refused_restart)
        block = failure_block.Block(root=root, others=self.failures[1:], stacks=dict(stacks or {}), logs=logs,
                                    headline=head, elsewhere=elsewhere, suspects=suspects)
        super().__init__(_with_hint(failure_block.render(block, FULL_REPORT), hint), result=result)


def node_name(index: Optional[int], host: str = "") -> str:
    """A node's one name, everywhere."""
    if index is None:
        return "node ?"
    return "node %d (%s)" % (index, host) if host else "node %d" % index


def first_failure(failure: RankFailure, host: str = "") -> str:
    """Who failed first, and what it raised where no traceback says it (a signal)."""
    text = "%s, rank %d (local rank %d, pid %d)" % (
        node_name(failure.node_index, host), failure.rank, failure.local_rank, failure.pid)
    if not failure.traceback or not failure.traceback.lstrip().startswith("Traceback"):
        text += ": %s: %s" % (failure.exc_type, failure.message)
    return text


def failure_summary(failure: RankFailure) -> str:
    """One line for a rank's failure: who, what."""
    return "%s, rank %d (local rank %d, pid %d): %s: %s" % (
        node_name(failure.node_index, failure.host), failure.rank, failure.local_rank, failure.pid,
        failure.exc_type, first_line(failure.message))


def rank_raised(original: BaseException, error: TorchrunFailed) -> BaseException:
    """A function entrypoint's exception as the step raises it: of the user's type (``except ValueError``
    still catches it) and a ``TorchrunFailed`` (Metaflow prints the failure block, no "Internal error").
    The original where its type cannot be mixed."""
    kind = type(original)
    try:
        mixed = _MIXED.get(kind)
        if mixed is None:
            mixed = _MIXED[kind] = type(kind.__name__, (kind, TorchrunFailed), {
                "__module__": kind.__module__, "__qualname__": kind.__qualname__,
                "__str__": lambda self: self._user_text, "headline": "@torchrun: a rank raised %s" % kind.__name__,
                # Pickled (an artifact, a Metaflow wrapper) as the user's own exception.
                "__reduce_ex__": lambda self, protocol: self._original.__reduce_ex__(protocol)})
        new: Any = kind.__new__(mixed, *original.args)
        new.__dict__.update(original.__dict__)
        new.__dict__.update(error.__dict__)
        new.args = original.args
        new._user_text = str(original)
        new._original = original
        new.__cause__ = None
        new.__suppress_context__ = True
        return new
    except Exception:
        original.__cause__ = error
        return original


_MIXED: Dict[type, type] = {}


class GangAborted(TorchrunException):
    """This node stopped because the gang failed elsewhere (a node's step or
    ranks failed, a node went silent or never joined)."""

    headline = "@torchrun gang stopped"

    def __init__(self, node_index: int, cause: "Cause", own_exit_code: Optional[int] = None,
                 same_log: bool = False, stacks: Optional[Dict[int, str]] = None, logs: str = "",
                 elsewhere: Sequence[int] = (), suspects: Sequence[str] = (), result: Optional[object] = None,
                 refused_restart: str = "", hint: str = ""):
        from .cause import CauseKind
        from .procs import failure_block

        self.node_index = node_index
        self.cause = cause
        origin = cause.node_index
        lines = []
        if cause.exc_type == TorchrunNotRetried.__name__ and origin != node_index:  # said on node 0
            self.headline = TorchrunNotRetried.headline
            text = "node %d ran nothing: %s" % (node_index, "node %s's error in this log says why" % origin
                                                if same_log else (cause.message or cause.summary))
        elif same_log and is_refusal(cause):  # the refusing node's own error in this log says it once
            text = "node %d stopped because node %s refused its current.torch.run call (its error is in this log)." % (
                node_index, origin if origin is not None else "?")
        elif origin is not None and origin != node_index and cause.kind in (CauseKind.RANK_FAILED,
                                                                            CauseKind.STEP_FAILED):
            if same_log:  # the failing node's own error in this log has what there is
                text = "node %d stopped because node %d failed first (its error %s): %s" % (
                    node_index, origin, _its_error(cause), first_line(cause.summary))
            else:
                text = "node %d stopped because node %d failed first: %s" % (node_index, origin, cause.summary)
                if cause.traceback:
                    lines = failure_block.traceback_lines(cause.traceback)
        else:
            text = "node %d stopped: %s" % (node_index, cause.summary)
        if cause.kind is CauseKind.PREFLIGHT and cause.message:
            if same_log and node_index != 0:
                text += " (node 0's error in this log has every field and the fix)"
            else:
                text += "\n" + cause.message  # every field and node, and the fix
        elif cause.kind is CauseKind.NODE_LOST and cause.message and not (same_log and node_index != 0):
            if same_log and cause.message.startswith(LAST_LINES_HEAD):  # its stderr came through this log
                text += "; its last lines of output are above, as it wrote them"
            else:
                text += "\n" + cause.message
        # After a hang the gang stopped every rank: none failed as an echo of it.
        echoes = [] if cause.kind is CauseKind.HANG else [r for r in elsewhere if r != cause.rank]
        block = failure_block.Block(stacks=dict(stacks or {}), logs=logs, suspects=suspects, elsewhere=echoes)
        rest = failure_block.render(block, FULL_REPORT)
        if refused_restart and not same_log:  # a local run's failing node's error says it once
            text += "\n" + _clause(refused_restart)
        super().__init__(_with_hint("\n".join([text] + lines + ([rest] if rest else [])), hint), result=result)


def _its_error(cause: "Cause") -> str:
    """What the failing node's error in the same log holds."""
    from .procs import failure_block

    if not cause.traceback:
        return "is in this log"
    if cause.traceback.startswith(failure_block.CRASH_OUTPUT):
        return "in this log has the rank's last lines of stderr"
    return "in this log has the traceback"


class TorchrunInterrupted(TorchrunException):
    """The step was asked to stop (SIGTERM, Ctrl-C, ``@timeout``, a spot
    notice) while torchrun was running: the whole gang was stopped gracefully."""

    headline = "@torchrun interrupted"


def raise_all(problems: List[str]) -> None:
    """One refusal naming every problem, rather than one run (on AWS Batch, one job) per mistake."""
    problems = [p for p in problems if p]
    if len(problems) == 1:
        raise TorchrunInvalidArgument(problems[0])
    if problems:
        raise TorchrunInvalidArgument(
            "%d problems:\n%s" % (len(problems), "\n".join("- " + p for p in problems))
        )


class Problems:
    """``TorchrunInvalidArgument`` messages of several checks, each run before the step is refused."""

    def __init__(self) -> None:
        self.messages: List[str] = []

    def check(self, func, *args, **kwargs):
        """``func(*args, **kwargs)``, or None with its message kept."""
        with self:
            return func(*args, **kwargs)
        return None

    def __enter__(self) -> "Problems":
        return self

    def __exit__(self, kind: Any, error: Any, tb: Any) -> bool:
        """``with problems: value = check(...)``: a refusal in the block is kept and the code after it
        runs on, without this lower layer calling a planner's checks back."""
        if isinstance(error, TorchrunInvalidArgument):
            self.messages.extend(_split(error.message))
            return True
        return False

    def add(self, message: str) -> None:
        self.messages.append(message)

    def raise_all(self) -> None:
        raise_all(self.messages)


def _split(message: str) -> List[str]:
    """A message from ``raise_all``, apart into its problems."""
    lines = message.splitlines()
    if lines and lines[0].endswith(" problems:") and all(l.startswith("- ") for l in lines[1:]):
        return [l[2:] for l in lines[1:]]
    return [message]


def print_as_written() -> None:
    """Metaflow's CLI prints a failed step's error with ``echo_always``, which highlights what stands between
    two ``*`` and drops the asterisks: a rank's ``2**53`` read ``253``, ``0.9 ** s`` ``0.9  s``, and every
    ``*args`` and ``**kwargs`` of a traceback lost its stars. From here on, in this process (the runtime, or
    the task of a ``@torchrun`` step), the message of our errors and a traceback (which Metaflow prints with
    no highlight) print as written, with Metaflow's layout; any other error as Metaflow prints it."""
    cli: Any = sys.modules.get("metaflow.cli")  # loaded by then wherever Metaflow's CLI prints an error
    echo, metaflows = getattr(cli, "echo_always", None), getattr(cli, "print_metaflow_exception", None)
    if echo is None or metaflows is None or getattr(metaflows, "as_written", False) \
            or not hasattr(cli, "print_unknown_exception"):
        return  # not Metaflow's CLI as we know it (2.12 to 2.19), or already done

    def print_metaflow_exception(ex: BaseException) -> None:
        if not isinstance(ex, TorchrunException):
            return metaflows(ex)
        echo(ex.headline, indent=True, nl=False, bold=True)
        location = "".join([" in file %s" % ex.source_file if ex.source_file is not None else "",
                            " on line %d" % ex.line_no if ex.line_no is not None else "", ":"])
        echo(location, bold=True)
        echo(ex.message, indent=True, bold=False, padding_bottom=True, no_bold=True)  # no_bold: no highlight

    def print_unknown_exception(ex: BaseException) -> None:
        import traceback  # here, not at the top: `import metaflow` loads this module

        echo("Internal error", indent=True, bold=True)
        echo(traceback.format_exc(), no_bold=True)

    print_metaflow_exception.as_written = True  # type: ignore[attr-defined]
    cli.print_metaflow_exception = print_metaflow_exception
    cli.print_unknown_exception = print_unknown_exception


def drop_own_frame(error: BaseException, filename: str) -> None:
    """A re-raised step exception without the wrapper's frame (in ``filename``) at its head: Metaflow
    prints the step's traceback, where ours is noise."""
    tb = error.__traceback__
    if tb is not None and tb.tb_frame.f_code.co_filename == filename and tb.tb_next is not None:
        error.__traceback__ = tb.tb_next
