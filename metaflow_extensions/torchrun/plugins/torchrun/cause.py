"""Why a gang stopped, as a typed record.

A ``Cause`` is built where the failure is seen (a rank's record, a step's
exception, a silent node), travels between nodes as JSON (``to_wire`` /
``from_wire``) and ends in the step's error, the result record and the card.
Everything read from the wire is checked field by field: a peer's message
never reaches the rest of the code as an arbitrary object.
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field, fields, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .procs import numbers

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


@dataclass(frozen=True)
class Cause:
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
    # NEVER_JOINED: the nodes that did not join; UNRESPONSIVE: the nodes that
    # fell silent together, when more than one did (gang/silence.py).
    missing: Tuple[int, ...] = ()
    # Which current.torch.run call of the step (0-based) it happened in, if any.
    call: Optional[int] = None
    # PREEMPTED: the seconds every node's ranks get to stop (runtime/stop.py).
    grace: Optional[float] = None
    time: float = field(default_factory=time.time)

    def to_wire(self) -> Dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["kind"] = self.kind.value
        data["missing"] = list(self.missing)
        return {k: v for k, v in data.items() if v is not None}

    @classmethod
    def from_wire(cls, data: Any) -> Optional["Cause"]:
        """A cause from a peer, or None when it is not one: every field is
        checked for its type and size."""
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
        return cls(
            kind=kind,
            summary=summary,
            node_index=_small_int(data.get("node_index")),
            rank=_small_int(data.get("rank")),
            local_rank=_small_int(data.get("local_rank")),
            exit_code=_small_int(data.get("exit_code")),
            exc_type=_text(data.get("exc_type"), 200),
            message=_text(data.get("message"), MAX_TEXT),
            traceback=_text(data.get("traceback"), MAX_TRACEBACK),
            secondary=data.get("secondary") is True,
            missing=tuple(m for m in (_int_list(data.get("missing")) or []))[:1024],
            call=_small_int(data.get("call")),
            grace=_grace(data.get("grace")),
            time=when,
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


def _int_list(value: Any) -> Optional[List[int]]:
    if not isinstance(value, list):
        return None
    out = [_small_int(v) for v in value]
    return [v for v in out if v is not None]


def _is_real(value: Any) -> bool:
    """A finite number that fits a float: JSON ints are unbounded, and
    ``math.isfinite(10**400)`` raises instead of saying no."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        return abs(value) < 2**53
    return math.isfinite(value)


def plural(items: List[int], noun: str = "node", cap: int = 16) -> str:
    """``nodes 1, 4-9, 12``: a message about 4,000 nodes stays one short line."""
    return "%s%s %s" % (noun, "s" if len(items) != 1 else "", numbers(items, cap))
