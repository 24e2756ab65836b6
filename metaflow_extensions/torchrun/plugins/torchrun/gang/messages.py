"""Every message of the gang's protocol, as a typed record.

One frozen dataclass per ``MessageType``. Code on both ends builds and reads
these records; they become JSON only on the wire (``to_wire``), and a line from
a peer becomes a record only through ``parse``, which checks every field for
its type and bound and raises ``ProtocolError`` otherwise. Whoever receives a
``ProtocolError`` drops the peer that sent it: a malformed message costs its
sender, never the service.

Sizes: every message is bounded whatever the gang's size. A node's report
carries its own ranks only (at most ``MAX_RANKS_PER_NODE``, each tail a few
lines); nothing the service sends lists the gang's nodes.
"""

from __future__ import annotations

import base64
import binascii
import enum
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Iterator, Mapping, Optional, Tuple, Type, TypeVar

from ..cause import Cause
from ..procs import MAX_STACK_BYTES
from ..procs import FlightError, FlightSummary, RankStatus, StatusError
from .bench import Bench
from .node_progress import NodeProgress
from .wire import Message as WireDict
from .wire import ProtocolError

# 4: typed messages; no "joined" list; call_all_done and all_left go to the
# control only. 5: ``probe``. 6: ``stacks_in``. 7: the bench (spares) on ``go`` and ``restart``.
PROTOCOL = 7

NONCE_BYTES = 32
PROOF_HEX = 64  # sha256, in hex
MAX_NODE = 1 << 20
MAX_CALL = 1 << 20
MAX_RESTART = 1 << 16
# A node runs at most this many ranks (nproc_per_node); its report and its
# stacks carry at most this many entries.
MAX_RANKS_PER_NODE = 4096
# Per rank and stream: the last lines of output a report carries.
TAIL_LINES = 20
TAIL_LINE_CHARS = 1000
STREAMS = ("stdout", "stderr")


class MessageType(str, enum.Enum):
    CHALLENGE = "challenge"  # service -> peer, on connect
    HELLO = "hello"  # peer -> service: who it is, and its proof
    WELCOME = "welcome"  # service -> peer: its own proof (and the cause, if any)
    REJECT = "reject"  # service -> peer: not authenticated, or the index is taken
    HEARTBEAT = "hb"  # both ways
    CALL = "call"  # node -> service: reached call k
    GO = "go"  # service -> node: launch call k, on this rendezvous port
    CALL_DONE = "call_done"  # node -> service: its part of call k succeeded
    CALL_ALL_DONE = "call_all_done"  # service -> control: every node is done with call k
    FAILED = "failed"  # node -> service: a failure of its own
    STACKS = "stacks"  # node -> service: where its ranks were when stopped
    STACKS_IN = "stacks_in"  # service -> every node: every node's stacks of call k are in; stop the ranks
    LEAVE = "leave"  # node -> service: its step ended
    ALL_LEFT = "all_left"  # service -> control: every node left
    ABORT = "abort"  # service -> every node: the gang is over, and why
    PREFLIGHT = "preflight"  # node -> service: its software fingerprint and fitness checks
    RESTART = "restart"  # service -> every node: restart call k's ranks, on this rendezvous port
    PROBE = "probe"  # a member node on a fresh connection, in place of a hello: still here (gang/probing.py)


# -- field readers: each returns the value or raises ProtocolError ---------------------


def _int(data: Mapping[str, Any], name: str, low: int = 0, high: int = MAX_NODE, optional: bool = False) -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ProtocolError("field %r: not an integer in [%d, %d]" % (name, low, high))
    return value


def _real(data: Mapping[str, Any], name: str, low: float, high: float, optional: bool = True) -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError("field %r: not a number" % name)
    if isinstance(value, int) and abs(value) >= 2**53 or not math.isfinite(value) or not low <= value <= high:
        raise ProtocolError("field %r: out of range" % name)
    return float(value)


def _str(data: Mapping[str, Any], name: str, limit: int, optional: bool = False) -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise ProtocolError("field %r: not a string of at most %d characters" % (name, limit))
    return value


def _hex(data: Mapping[str, Any], name: str, size: int) -> bytes:
    value = _str(data, name, 2 * size)
    if len(value) != 2 * size:
        raise ProtocolError("field %r: not %d hex digits" % (name, 2 * size))
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise ProtocolError("field %r: not hex" % name) from None


def _bool(data: Mapping[str, Any], name: str) -> bool:
    value = data.get(name)
    if not isinstance(value, bool):
        raise ProtocolError("field %r: not a boolean" % name)
    return value


def _optional_cause(data: Mapping[str, Any], name: str) -> Optional[Cause]:
    return None if data.get(name) is None else _cause(data, name)


def _cause(data: Mapping[str, Any], name: str) -> Cause:
    cause = Cause.from_wire(data.get(name))
    if cause is None:
        raise ProtocolError("field %r: not a cause" % name)
    return cause


# -- the records ------------------------------------------------------------------------

M = TypeVar("M", bound="GangMessage")


class GangMessage:
    """Base of every message: ``TYPE`` names it on the wire."""

    TYPE: ClassVar[MessageType]

    def fields(self) -> Dict[str, Any]:
        return {}

    def to_wire(self) -> WireDict:
        data: WireDict = {"type": self.TYPE.value}
        data.update({k: v for k, v in self.fields().items() if v is not None})
        return data

    @classmethod
    def from_wire(cls: Type[M], data: Mapping[str, Any]) -> M:
        raise NotImplementedError


@dataclass(frozen=True)
class Challenge(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.CHALLENGE
    nonce: bytes
    protocol: int = PROTOCOL

    def fields(self) -> Dict[str, Any]:
        return {"protocol": self.protocol, "nonce": self.nonce.hex()}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "Challenge":
        return cls(nonce=_hex(data, "nonce", NONCE_BYTES), protocol=_int(data, "protocol", 0, 1 << 16))


@dataclass(frozen=True)
class Hello(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.HELLO
    node_index: int
    nonce: bytes
    proof: str
    host: str = "?"
    pid: int = 0
    protocol: int = PROTOCOL

    def fields(self) -> Dict[str, Any]:
        return {"protocol": self.protocol, "node_index": self.node_index, "host": self.host[:255],
                "pid": self.pid, "nonce": self.nonce.hex(), "proof": self.proof}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "Hello":
        return cls(
            node_index=_int(data, "node_index", 0, MAX_NODE - 1),
            nonce=_hex(data, "nonce", NONCE_BYTES),
            proof=_str(data, "proof", PROOF_HEX),
            host=_str(data, "host", 255, optional=True) or "?",
            pid=_int(data, "pid", 0, 1 << 31, optional=True) or 0,
            protocol=_int(data, "protocol", 0, 1 << 16),
        )


@dataclass(frozen=True)
class Probe(GangMessage):
    """A member node, on a fresh connection while its own one is silent
    (``probing.py``): "node i is still here", with a proof of the secret over
    this connection's nonces (``auth.probe``). The service answers with a
    ``welcome`` (its own proof, and the cause if the gang is over) and closes:
    both sides count that as hearing from the other."""

    TYPE: ClassVar[MessageType] = MessageType.PROBE
    node_index: int
    nonce: bytes
    proof: str
    protocol: int = PROTOCOL

    def fields(self) -> Dict[str, Any]:
        return {"protocol": self.protocol, "node_index": self.node_index, "nonce": self.nonce.hex(),
                "proof": self.proof}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "Probe":
        return cls(
            node_index=_int(data, "node_index", 0, MAX_NODE - 1),
            nonce=_hex(data, "nonce", NONCE_BYTES),
            proof=_str(data, "proof", PROOF_HEX),
            protocol=_int(data, "protocol", 0, 1 << 16),
        )


@dataclass(frozen=True)
class Welcome(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.WELCOME
    proof: str
    cause: Optional[Cause] = None  # the gang is already over: why

    def fields(self) -> Dict[str, Any]:
        return {"proof": self.proof, "cause": self.cause.to_wire() if self.cause else None}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "Welcome":
        return cls(proof=_str(data, "proof", PROOF_HEX), cause=_optional_cause(data, "cause"))


@dataclass(frozen=True)
class Reject(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.REJECT
    reason: str

    def fields(self) -> Dict[str, Any]:
        return {"reason": self.reason}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "Reject":
        reason = data.get("reason")
        return cls(reason=reason if isinstance(reason, str) and 0 < len(reason) <= 200 else "no reason given")


@dataclass(frozen=True)
class Heartbeat(GangMessage):
    """From a node while its call's job runs: seconds since its ranks last
    wrote output (its own clock; the control's hang_timeout reads it), and
    its ranks' progress summed up (``node_progress.py``: one bounded record
    per node whatever its number of ranks)."""

    TYPE: ClassVar[MessageType] = MessageType.HEARTBEAT
    quiet: Optional[float] = None
    progress: Optional[NodeProgress] = None

    def fields(self) -> Dict[str, Any]:
        return {"quiet": None if self.quiet is None else round(max(0.0, self.quiet), 3),
                "progress": None if self.progress is None else self.progress.to_wire()}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "Heartbeat":
        progress = data.get("progress")
        return cls(quiet=_real(data, "quiet", 0.0, 1e9 - 1),
                   progress=None if progress is None else NodeProgress.from_wire(progress))


@dataclass(frozen=True)
class Call(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.CALL
    index: int
    entry: str

    def fields(self) -> Dict[str, Any]:
        return {"index": self.index, "entry": self.entry[:1000]}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "Call":
        return cls(index=_int(data, "index", 0, MAX_CALL), entry=_str(data, "entry", 1000, optional=True) or "?")


@dataclass(frozen=True)
class Go(GangMessage):
    """Launch call ``index`` on ``rdzv_port``; ``bench``: the nodes that do
    not train in it (``@torchrun(spares)``, bench.py), K indices at most."""

    TYPE: ClassVar[MessageType] = MessageType.GO
    index: int
    rdzv_port: int
    bench: Bench = Bench()

    def fields(self) -> Dict[str, Any]:
        return {"index": self.index, "rdzv_port": self.rdzv_port,
                "bench": self.bench.to_wire() if self.bench.benched else None}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "Go":
        return cls(index=_int(data, "index", 0, MAX_CALL), rdzv_port=_int(data, "rdzv_port", 1, 65535),
                   bench=Bench.from_wire(data.get("bench")))


Tails = Dict[int, Dict[str, Tuple[str, ...]]]


@dataclass(frozen=True)
class NodeReport:
    """What a node tells the control as it finishes a call: its ranks and the
    last lines of their output. Bounded per node, so the control's memory for
    reports grows with the gang only linearly, and no message with it."""

    ranks: Tuple[RankStatus, ...] = ()
    tails: Tails = field(default_factory=dict)
    started: Optional[float] = None
    ended: Optional[float] = None
    truncated: bool = False  # cut to fit the line limit

    def to_wire(self) -> Dict[str, Any]:
        return {
            "ranks": [r.to_wire() for r in self.ranks],
            "tails": {str(rank): {s: list(lines) for s, lines in streams.items()}
                      for rank, streams in self.tails.items()},
            "started": self.started,
            "ended": self.ended,
            "truncated": self.truncated,
        }

    @classmethod
    def from_wire(cls, data: Any) -> "NodeReport":
        if not isinstance(data, Mapping):
            raise ProtocolError("a report is not an object")
        ranks = data.get("ranks") or []
        tails = data.get("tails") or {}
        if not isinstance(ranks, list) or not isinstance(tails, Mapping) or len(ranks) > MAX_RANKS_PER_NODE \
                or len(tails) > MAX_RANKS_PER_NODE:
            raise ProtocolError("a report's ranks or tails are malformed")
        return cls(
            ranks=tuple(_rank_status(r) for r in ranks),
            tails={_rank_key(k): _streams(v) for k, v in tails.items()},
            started=_real(data, "started", 0.0, 1e12),
            ended=_real(data, "ended", 0.0, 1e12),
            truncated=data.get("truncated") is True,
        )

    def cut(self) -> "NodeReport":
        """The same report without output tails: what is sent when the whole
        does not fit one line (a lost done would hang the control)."""
        return NodeReport(self.ranks[:MAX_RANKS_PER_NODE], {}, self.started, self.ended, truncated=True)


def _rank_status(data: Any) -> RankStatus:
    """A rank's status in a report (``procs/status.py`` holds the schema)."""
    try:
        return RankStatus.from_wire(data)
    except StatusError as e:
        raise ProtocolError(str(e)) from None


def _rank_key(key: Any) -> int:
    try:
        rank = int(key)
    except (TypeError, ValueError):
        raise ProtocolError("a rank key is not a number") from None
    if not 0 <= rank < 1 << 31:
        raise ProtocolError("a rank key is out of range")
    return rank


def _streams(value: Any) -> Dict[str, Tuple[str, ...]]:
    if not isinstance(value, Mapping):
        raise ProtocolError("a rank's tails are not an object")
    out: Dict[str, Tuple[str, ...]] = {}
    for stream in STREAMS:
        lines = value.get(stream) or []
        if not isinstance(lines, list) or len(lines) > TAIL_LINES or not all(isinstance(x, str) for x in lines):
            raise ProtocolError("a rank's %s tail is malformed" % stream)
        out[stream] = tuple(x[:TAIL_LINE_CHARS] for x in lines)
    return out


def _report(data: Mapping[str, Any], name: str) -> Optional[NodeReport]:
    value = data.get(name)
    return None if value is None else NodeReport.from_wire(value)


@dataclass(frozen=True)
class CallDone(GangMessage):
    """``rank0``: rank 0's pickled return value when rank 0 ran on this node,
    with ``rank0_proof``, a MAC over its bytes (``auth.payload_proof``); a
    value too big for one line is not sent, only its size."""

    TYPE: ClassVar[MessageType] = MessageType.CALL_DONE
    index: int
    report: Optional[NodeReport] = None
    rank0: Optional[bytes] = None
    rank0_proof: Optional[str] = None
    rank0_size: Optional[int] = None

    def fields(self) -> Dict[str, Any]:
        return {
            "index": self.index,
            "report": self.report.to_wire() if self.report else None,
            "rank0": base64.b64encode(self.rank0).decode() if self.rank0 is not None else None,
            "rank0_proof": self.rank0_proof,
            "rank0_size": self.rank0_size,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "CallDone":
        rank0 = data.get("rank0")
        payload = None
        if rank0 is not None:
            if not isinstance(rank0, str):
                raise ProtocolError("field 'rank0': not base64")
            try:
                payload = base64.b64decode(rank0, validate=True)
            except (binascii.Error, ValueError):
                raise ProtocolError("field 'rank0': not base64") from None
        return cls(
            index=_int(data, "index", 0, MAX_CALL),
            report=_report(data, "report"),
            rank0=payload,
            rank0_proof=_str(data, "rank0_proof", PROOF_HEX, optional=True),
            rank0_size=_int(data, "rank0_size", 0, 1 << 62, optional=True),
        )


@dataclass(frozen=True)
class CallAllDone(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.CALL_ALL_DONE
    index: int

    def fields(self) -> Dict[str, Any]:
        return {"index": self.index}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "CallAllDone":
        return cls(index=_int(data, "index", 0, MAX_CALL))


@dataclass(frozen=True)
class StacksIn(GangMessage):
    """Every node still in call ``index`` has sent its stacks: a node keeps
    its ranks alive until it hears this (runtime/call_stacks.py), as a peer's
    ranks in a collective with them would die with them before their own node
    had asked where they were."""

    TYPE: ClassVar[MessageType] = MessageType.STACKS_IN
    index: int

    def fields(self) -> Dict[str, Any]:
        return {"index": self.index}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "StacksIn":
        return cls(index=_int(data, "index", 0, MAX_CALL))


@dataclass(frozen=True)
class Failed(GangMessage):
    """``restart``: which start of the call's ranks failed (0: the first; k: the
    k-th restart), so that a report of ranks already replaced is not taken for
    a failure of the new ones."""

    TYPE: ClassVar[MessageType] = MessageType.FAILED
    cause: Cause
    call: Optional[int] = None
    report: Optional[NodeReport] = None
    restart: int = 0

    def fields(self) -> Dict[str, Any]:
        return {"cause": self.cause.to_wire(), "call": self.call,
                "report": self.report.to_wire() if self.report else None, "restart": self.restart or None}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "Failed":
        return cls(cause=_cause(data, "cause"), call=_int(data, "call", 0, MAX_CALL, optional=True),
                   report=_report(data, "report"), restart=_int(data, "restart", 0, MAX_RESTART, optional=True) or 0)


@dataclass(frozen=True)
class Restart(GangMessage):
    """The service's decision, to every node at once: stop call ``index``'s
    ranks and start them again as restart ``restart`` (1, 2, ...), with a
    fresh static rendezvous on ``rdzv_port`` (the previous one's store dies
    with node 0's old agent). ``cause``: what failed. ``bench``: the nodes
    that sit the restart out (a swap: ``swapped_in`` came in from the spares
    for the node the cause is pinned to). The same few fields whatever the
    gang's size: the bench is K indices at most."""

    TYPE: ClassVar[MessageType] = MessageType.RESTART
    index: int
    restart: int
    rdzv_port: int
    cause: Cause
    bench: Bench = Bench()
    swapped_in: Optional[int] = None

    def fields(self) -> Dict[str, Any]:
        return {"index": self.index, "restart": self.restart, "rdzv_port": self.rdzv_port,
                "cause": self.cause.to_wire(), "bench": self.bench.to_wire() if self.bench.benched else None,
                "swapped_in": self.swapped_in}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "Restart":
        return cls(index=_int(data, "index", 0, MAX_CALL), restart=_int(data, "restart", 1, MAX_RESTART),
                   rdzv_port=_int(data, "rdzv_port", 1, 65535), cause=_cause(data, "cause"),
                   bench=Bench.from_wire(data.get("bench")), swapped_in=_int(data, "swapped_in", optional=True))

    @property
    def swapped_out(self) -> Optional[int]:
        return self.cause.node_index if self.swapped_in is not None else None


@dataclass(frozen=True)
class Stacks(GangMessage):
    """Where a node's ranks were when it stopped them (rank -> faulthandler's
    dump) and, where torch records them, the collectives each had entered
    (rank -> its Flight Recorder summary, procs/flight.py: a few hundred bytes
    at most); both empty when it had no live rank. Entries that are not a rank
    and a text or a summary are left out, not fatal: both are best effort."""

    TYPE: ClassVar[MessageType] = MessageType.STACKS
    call: int
    stacks: Dict[int, str] = field(default_factory=dict)
    flights: Dict[int, FlightSummary] = field(default_factory=dict)

    def fields(self) -> Dict[str, Any]:
        return {"call": self.call, "stacks": {str(r): t for r, t in self.stacks.items()},
                "flights": {str(r): s.to_wire() for r, s in self.flights.items()}}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "Stacks":
        value = data.get("stacks")
        if not isinstance(value, Mapping):
            raise ProtocolError("field 'stacks': not an object")
        stacks: Dict[int, str] = {}
        for rank, text in _by_rank(value):
            if isinstance(text, str):
                stacks[rank] = text[:MAX_STACK_BYTES]
        flights: Dict[int, FlightSummary] = {}
        value = data.get("flights", {})
        if not isinstance(value, Mapping):
            raise ProtocolError("field 'flights': not an object")
        for rank, summary in _by_rank(value):
            try:
                flights[rank] = FlightSummary.from_wire(summary)
            except FlightError:
                continue
        return cls(call=_int(data, "call", 0, MAX_CALL), stacks=stacks, flights=flights)


def _by_rank(value: Mapping[str, Any]) -> Iterator[Tuple[int, Any]]:
    """A node's entries keyed by rank: at most ``MAX_RANKS_PER_NODE``, keys
    that are not a rank left out."""
    for key, item in list(value.items())[:MAX_RANKS_PER_NODE]:
        try:
            rank = int(key)
        except (TypeError, ValueError):
            continue
        if 0 <= rank < 1 << 31:
            yield rank, item


@dataclass(frozen=True)
class Leave(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.LEAVE
    calls: int
    ok: bool

    def fields(self) -> Dict[str, Any]:
        return {"calls": self.calls, "ok": self.ok}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "Leave":
        return cls(calls=_int(data, "calls", 0, MAX_CALL), ok=_bool(data, "ok"))


@dataclass(frozen=True)
class AllLeft(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.ALL_LEFT

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "AllLeft":
        return cls()


@dataclass(frozen=True)
class Abort(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.ABORT
    cause: Cause

    def fields(self) -> Dict[str, Any]:
        return {"cause": self.cause.to_wire()}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "Abort":
        return cls(cause=_cause(data, "cause"))


# -- preflight (gang/node_compare.py compares; launch/node_checks.py measures) ----------------

# The fingerprint's fields, in the order messages name them. A node sends at
# most these; the service compares them across the gang.
FINGERPRINT_FIELDS = ("python", "torch", "cuda", "nccl", "cudnn", "metaflow", "metaflow_torchrun", "kernel")
FINGERPRINT_VALUE_CHARS = 64
CHECK_STATUSES = ("ok", "warn", "fail")
MAX_CHECKS = 16
CHECK_NAME_CHARS = 32
CHECK_TEXT_CHARS = 300


@dataclass(frozen=True)
class PreflightCheck:
    """One fitness check on one node: what was found, what was expected, and
    the fix when it is not ok."""

    name: str
    status: str  # one of CHECK_STATUSES
    found: str = ""
    expected: str = ""
    fix: str = ""

    def to_wire(self) -> Dict[str, Any]:
        return {"name": self.name[:CHECK_NAME_CHARS], "status": self.status,
                "found": self.found[:CHECK_TEXT_CHARS], "expected": self.expected[:CHECK_TEXT_CHARS],
                "fix": self.fix[:CHECK_TEXT_CHARS]}

    @classmethod
    def from_wire(cls, data: Any) -> "PreflightCheck":
        if not isinstance(data, Mapping):
            raise ProtocolError("a preflight check is not an object")
        status = _str(data, "status", 8)
        if status not in CHECK_STATUSES:
            raise ProtocolError("field 'status': not one of %s" % ", ".join(CHECK_STATUSES))
        name = _str(data, "name", CHECK_NAME_CHARS)
        if not name:
            raise ProtocolError("field 'name': empty")
        return cls(name=name, status=status,
                   found=_str(data, "found", CHECK_TEXT_CHARS, optional=True) or "",
                   expected=_str(data, "expected", CHECK_TEXT_CHARS, optional=True) or "",
                   fix=_str(data, "fix", CHECK_TEXT_CHARS, optional=True) or "")


@dataclass(frozen=True)
class Preflight(GangMessage):
    """A node's software fingerprint (read from files, never by importing
    torch) and its fitness checks; sent once, right after joining, before any
    ``call``. Every field is bounded: 1,024 of these fit the control's memory
    in well under a megabyte."""

    TYPE: ClassVar[MessageType] = MessageType.PREFLIGHT
    versions: Dict[str, str] = field(default_factory=dict)
    checks: Tuple[PreflightCheck, ...] = ()

    def fields(self) -> Dict[str, Any]:
        return {"versions": {k: v[:FINGERPRINT_VALUE_CHARS] for k, v in self.versions.items()
                             if k in FINGERPRINT_FIELDS},
                "checks": [c.to_wire() for c in self.checks[:MAX_CHECKS]]}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "Preflight":
        versions = data.get("versions")
        checks = data.get("checks")
        checks = [] if checks is None else checks
        if not isinstance(versions, Mapping):
            raise ProtocolError("field 'versions': not an object")
        unknown = [str(k)[:40] for k in versions if k not in FINGERPRINT_FIELDS]
        if unknown:
            raise ProtocolError("field 'versions': unknown field %r" % unknown[0])
        for key in versions:
            _str(versions, key, FINGERPRINT_VALUE_CHARS)
        if not isinstance(checks, list) or len(checks) > MAX_CHECKS:
            raise ProtocolError("field 'checks': not a list of at most %d checks" % MAX_CHECKS)
        return cls(versions=dict(versions), checks=tuple(PreflightCheck.from_wire(c) for c in checks))


KINDS: Dict[MessageType, Type[GangMessage]] = {
    cls.TYPE: cls for cls in (Challenge, Hello, Welcome, Reject, Heartbeat, Call, Go, CallDone, CallAllDone, Failed,
                              Stacks, StacksIn, Leave, AllLeft, Abort, Preflight, Restart, Probe)
}


def parse(data: Mapping[str, Any]) -> GangMessage:
    """A wire object to its record; ``ProtocolError`` for an unknown type or a
    field of the wrong type or size."""
    try:
        kind = MessageType(data.get("type"))
    except ValueError:
        raise ProtocolError("unknown message type %r" % str(data.get("type"))[:40]) from None
    return KINDS[kind].from_wire(data)


def parse_as(data: Mapping[str, Any], expected: Type[M]) -> M:
    message = parse(data)
    if not isinstance(message, expected):
        raise ProtocolError("expected %s, got %s" % (expected.TYPE.value, message.TYPE.value))
    return message
