"""Why a gang stopped, as a typed record: built where the failure is seen, sent between nodes as JSON
(checked field by field on the way in), and shown in the step's error, the result record and the card.
"""

from __future__ import annotations

import enum
import math
import os
import re
import time
from dataclasses import dataclass, field, replace
from typing import Any, List, Mapping, Optional, Tuple

from .base.codec import Written
from .procs.failures import NO_EXCEPTION
from .procs.ranges import numbers

# Text fields from the wire are cut to these many characters.
MAX_TEXT = 4000
MAX_TRACEBACK = 64 * 1024


class CauseKind(str, enum.Enum):
    RANK_FAILED = "failed"  # a rank (or torchrun itself) ended unsuccessfully
    STEP_FAILED = "step_failed"  # the step's own code raised outside torchrun
    NODE_LOST = "node_lost"  # a node's connection dropped: its task died
    UNRESPONSIVE = "unresponsive"  # a node sent no heartbeat for heartbeat_timeout
    NEVER_JOINED = "never_joined"  # nodes missing after start_timeout
    LEFT_EARLY = "left_early"  # a node ended its step while others waited in a call
    CALL_MISMATCH = "call_mismatch"  # nodes made different current.torch.run calls
    CALL_TIMEOUT = "call_timeout"  # nodes did not reach a call within start_timeout
    CONTROL_UNREACHABLE = "control_unreachable"
    CONTROL_LOST = "control_lost"
    CONTROL_UNRESPONSIVE = "control_unresponsive"
    INTERRUPTED = "interrupted"  # the step was asked to stop (SIGTERM, Ctrl-C)
    HANG = "hang"  # no rank wrote a line for hang_timeout
    PREFLIGHT = "preflight"  # a preflight check failed before the user's ranks started
    PREEMPTED = "preempted"  # a node was told to stop (SIGTERM, a spot notice): the whole gang stops gracefully
    REGROWN = "regrown"  # a lost node came back: the ranks restart with the gang at its size again (no failure)
    STRAGGLER = "straggler"  # a rank the others waited for too long: its node swapped for a spare (swap_stragglers)


# Causes a node finds on its own: the service may not know them, and cannot answer this node any more.
CONTROL_GONE = (CauseKind.CONTROL_LOST, CauseKind.CONTROL_UNRESPONSIVE, CauseKind.CONTROL_UNREACHABLE)


@dataclass(frozen=True)
class Cause(Written):
    DROP_NONE = True
    kind: CauseKind
    summary: str
    node_index: Optional[int] = None
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    exit_code: Optional[int] = None
    exc_type: Optional[str] = None
    message: Optional[str] = None
    traceback: Optional[str] = None
    # An echo of another failure (a peer's closed connection): ranked last.
    secondary: bool = False
    # NEVER_JOINED: the nodes that did not join; UNRESPONSIVE: those that fell silent together.
    missing: Tuple[int, ...] = ()
    # Which current.torch.run call of the step (0-based) it happened in, if any.
    call: Optional[int] = None
    # PREEMPTED: the seconds every node's ranks get to stop (runtime/stop.py).
    grace: Optional[float] = None
    time: float = field(default_factory=time.time)

    @classmethod
    def from_wire(cls, data: Any) -> Optional["Cause"]:
        """A cause from a peer, or None without a kind or a summary. Hand-read, not by the codec: a
        cause is shown, so a bad field is dropped or cut, never refused."""
        if not isinstance(data, Mapping):
            return None
        try:
            kind = CauseKind(data.get("kind"))
        except ValueError:
            return None
        summary = _text(data.get("summary"), MAX_TEXT)
        if not summary:
            return None
        stamp = data.get("time")
        when = float(stamp) if stamp is not None and _is_real(stamp) else time.time()
        ints = {name: _small_int(data.get(name)) for name in ("node_index", "rank", "local_rank", "exit_code", "call")}
        return cls(
            kind=kind, summary=summary, **ints, exc_type=_text(data.get("exc_type"), 200),
            message=_text(data.get("message"), MAX_TEXT), traceback=_text(data.get("traceback"), MAX_TRACEBACK),
            secondary=data.get("secondary") is True, missing=tuple(_int_list(data.get("missing")))[:1024],
            grace=_grace(data.get("grace")), time=when,
        )

    def with_node(self, node_index: int) -> "Cause":
        """The service stamps who sent a failure: a node speaks for itself only."""
        return replace(self, node_index=node_index)


def _text(value: Any, limit: int) -> Optional[str]:
    if not isinstance(value, str):
        return None
    return value if len(value) <= limit else value[:limit] + " [...]"


def _small_int(value: Any) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if -(2**31) <= value < 2**31 else None


def _grace(value: Any) -> Optional[float]:
    """Seconds of grace from a peer: a finite number, at most a day."""
    if value is None or not _is_real(value):
        return None
    return min(max(float(value), 0.0), 86400.0)


def _int_list(value: Any) -> List[int]:
    return [v for v in map(_small_int, value) if v is not None] if isinstance(value, list) else []


def _is_real(value: Any) -> bool:
    """A finite number that fits a float (``math.isfinite(10**400)`` raises)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        return abs(value) < 2**53
    return math.isfinite(value)


def plural(items: List[int], noun: str = "node", cap: int = 16) -> str:
    """``nodes 1, 4-9, 12``: a message about 4,000 nodes stays one short line."""
    return "%s%s %s" % (noun, "s" if len(items) != 1 else "", numbers(items, cap))


# -- whose failure it was: one classification for retry_on and the in-step restart --

_CODE_KINDS = (CauseKind.RANK_FAILED, CauseKind.STEP_FAILED, CauseKind.CALL_MISMATCH)
# Exceptions that are the world's, not the code's: a peer or the network gone,
# torch's store or a collective timing out, the task told to stop.
_INFRA_TYPES = frozenset((
    "DistBackendError", "DistNetworkError", "DistStoreError", "DistError",
    "GangAborted", "TorchrunInterrupted", "KeyboardInterrupt", "SystemExit",
    "ConnectionError", "ConnectionResetError", "ConnectionRefusedError", "BrokenPipeError",
))
_EXC_NAME = re.compile(r"[A-Za-z_][\w.]*")
_INFRA_TEXT = re.compile(
    r"NCCL|gloo|Connection (closed|reset|refused)|Broken pipe|ECC error|uncorrectable|Xid|"
    r"collective operation timeout|Watchdog caught|"
    # A device that failed under the code (@torchrun(spares) swaps its node): not a bug of the code's.
    r"busy or unavailable|no CUDA-capable device|GPU is lost|fallen off the bus", re.I)
# Frames of the launcher, Metaflow, installed packages and the standard library are not "your code".
_NOT_USER = re.compile(r"site-packages|dist-packages|/metaflow_extensions/|/metaflow/|/lib/python3\.\d+/")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def place(traceback: Optional[str]) -> Optional[str]:
    """``train.py:88``: the innermost frame of the user's code, else the innermost frame."""
    frames = _FRAME.findall(traceback or "")
    if not frames:
        return None
    mine = [f for f in frames if not _NOT_USER.search(f[0])]
    path, line = (mine or frames)[-1]
    return "%s:%s" % (os.path.basename(path), line)


def user_code_failure(cause: Optional[Cause]) -> Optional[str]:
    """``ValueError at train.py:88`` when the user's code raised the cause (in a rank or the step); None
    for the world's failures: a node lost or preempted, a signal, a NCCL/gloo error, a stop, a hang."""
    if cause is None or cause.kind not in _CODE_KINDS or cause.secondary:
        return None
    if cause.kind is CauseKind.CALL_MISMATCH:
        return "a mismatch of current.torch.run calls between nodes"
    exc_type = cause.exc_type
    if (not exc_type or exc_type.split(".")[-1] in _INFRA_TYPES or cause.message == NO_EXCEPTION
            or not _EXC_NAME.fullmatch(exc_type)):  # "killed by signal SIGSEGV": an exit
        return None  # not an exception of the code: a signal (an OOM kill), an exit code
    if _INFRA_TEXT.search("%s\n%s" % (cause.message or "", cause.summary)):
        return None
    where = place(cause.traceback)
    return "%s at %s" % (exc_type, where) if where else exc_type


_RESTARTABLE = (CauseKind.RANK_FAILED, CauseKind.HANG, CauseKind.STRAGGLER)


def restartable_in_step(cause: Optional[Cause]) -> bool:
    """Whether ``@torchrun(restarts=N)`` may restart the ranks: every node's task is alive (a rank's
    signal or NCCL/gloo error, a hang), and it was no exception of the user's code (it would raise again)."""
    if cause is None or cause.kind not in _RESTARTABLE:
        return False
    return cause.kind in (CauseKind.HANG, CauseKind.STRAGGLER) or user_code_failure(cause) is None
