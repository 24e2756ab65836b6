"""Every message of the gang's protocol, as a frozen record per ``MessageType``.

JSON only on the wire (``to_wire``); a peer's line becomes a record only
through ``parse``, every field checked by its annotation (``codec.py``), else
``ProtocolError``: a malformed message costs its sender, never the service.
Every message is bounded whatever the gang's size: a node's report carries its
own ranks only, and nothing the service sends lists the gang's nodes.
"""

from __future__ import annotations

import base64
import binascii
import enum
import ipaddress
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Dict, Iterator, Mapping, Optional, Tuple, Type, TypeVar

from ..cause import Cause
from ..base.codec import NEED, SKIP, Hex, Int, Items, OneOf, Real, Record, Text, Via, decode, encode
from ..procs.stacks import MAX_STACK_BYTES
from ..procs.flight import FlightError, FlightSummary
from ..procs.status import RankStatus
from .bench import Bench
from .gang_progress import NodeProgress
from .wire import Message as WireDict
from .wire import ProtocolError

# 5: ``probe``. 6: ``stacks_in``. 7: the bench (spares) on ``go`` and ``restart``. 8: ``snapshot_peers``.
PROTOCOL = 9

NONCE_BYTES = 32
PROOF_HEX = 64  # sha256, in hex
MAX_NODE = 1 << 20
MAX_CALL = 1 << 20
MAX_RESTART = 1 << 16
MAX_RANKS_PER_NODE = 4096  # a node's report and stacks carry at most this many
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
    PROBE = "probe"  # a member node on a fresh connection, in place of a hello: still here
    SNAPSHOT_PEERS = "snapshot_peers"  # service -> node: where its snapshot store's buddy and a source are


NodeIndex = Annotated[int, Int(0, MAX_NODE - 1)]
CallIndex = Annotated[int, Int(0, MAX_CALL)]
Port = Annotated[int, Int(1, 65535)]
Nonce = Annotated[bytes, Hex(NONCE_BYTES)]
Proof = Annotated[str, Text(PROOF_HEX)]
Protocol = Annotated[int, Int(0, 1 << 16), NEED]


def _cause(value: Any) -> Cause:
    cause = Cause.from_wire(value)
    if cause is None:
        raise ValueError("not a cause")
    return cause


CAUSE = Via(_cause)


def _base64(value: Any) -> bytes:
    if not isinstance(value, str):
        raise ValueError("not base64")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not base64") from None


BASE64 = Via(_base64, lambda payload: None if payload is None else base64.b64encode(payload).decode())


def _address(value: Any) -> Tuple[str, int]:
    """A snapshot store's ``[ip, port]``: an address literal, never a name to resolve."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError("not [address, port]")
    host, port = value
    if not isinstance(host, str) or len(host) > 64 or isinstance(port, bool) or not isinstance(port, int) \
            or not 1 <= port <= 65535:
        raise ValueError("not [address, port]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError("not an IP address") from None
    return host, port


Address = Annotated[Tuple[str, int], Via(_address, list)]


M = TypeVar("M", bound="GangMessage")


class GangMessage(Record):
    """``TYPE`` names it on the wire; its fields follow, nulls left off."""

    TYPE: ClassVar[MessageType]
    ERROR = ProtocolError
    DROP_NONE = True

    def to_wire(self) -> WireDict:
        return {"type": self.TYPE.value, **encode(self)}


@dataclass(frozen=True)
class Challenge(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.CHALLENGE
    WIRE_ORDER = ("protocol", "nonce")
    nonce: Nonce
    protocol: Protocol = PROTOCOL


@dataclass(frozen=True)
class Hello(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.HELLO
    WIRE_ORDER = ("protocol", "node_index", "host", "pid", "nonce", "proof")
    node_index: NodeIndex
    nonce: Nonce
    proof: Proof
    host: Annotated[str, Text(255)] = "?"
    pid: Annotated[int, Int(0, 1 << 31)] = 0
    protocol: Protocol = PROTOCOL


@dataclass(frozen=True)
class Probe(GangMessage):
    """"Node i is still here", on a fresh connection while its own is silent; answered by a ``welcome``."""

    TYPE: ClassVar[MessageType] = MessageType.PROBE
    WIRE_ORDER = ("protocol", "node_index", "nonce", "proof")
    node_index: NodeIndex
    nonce: Nonce
    proof: Proof
    protocol: Protocol = PROTOCOL


@dataclass(frozen=True)
class Welcome(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.WELCOME
    proof: Proof
    cause: Annotated[Optional[Cause], CAUSE] = None  # the gang is already over: why


def _reason(value: Any) -> str:
    """A reason is shown, never acted on: a bad one is replaced, not refused."""
    return value if isinstance(value, str) and 0 < len(value) <= 200 else "no reason given"


@dataclass(frozen=True)
class Reject(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.REJECT
    reason: Annotated[str, Text(200), Via(_reason)]


@dataclass(frozen=True)
class Heartbeat(GangMessage):
    """``quiet``: seconds since the node's ranks last wrote, on its own clock (hang_timeout reads it)."""

    TYPE: ClassVar[MessageType] = MessageType.HEARTBEAT
    quiet: Annotated[Optional[float], Real(0.0, 1e9 - 1, digits=3)] = None
    progress: Optional[NodeProgress] = None
    # The start of the call's ranks that has committed a snapshot on the node (a restart point: gang/handlers).
    saved: Annotated[Optional[int], Int(0, MAX_RESTART)] = None


@dataclass(frozen=True)
class Call(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.CALL
    index: CallIndex
    entry: Annotated[str, Text(1000)] = "?"
    snapshot_port: Optional[Port] = None  # where its snapshot store takes its peers, at the address it calls from


@dataclass(frozen=True)
class Go(GangMessage):
    """``bench``: the nodes that do not train in call ``index``, K indices at most."""

    TYPE: ClassVar[MessageType] = MessageType.GO
    index: CallIndex
    rdzv_port: Port
    bench: Annotated[Bench, SKIP] = Bench()


Tails = Dict[int, Dict[str, Tuple[str, ...]]]


def _tails(value: Any) -> Tails:
    """Each rank's last lines are cut to fit, not refused; both streams always there."""
    if not isinstance(value, Mapping) or len(value) > MAX_RANKS_PER_NODE:
        raise ValueError("not an object of at most %d ranks" % MAX_RANKS_PER_NODE)
    return {_rank_key(k): _streams(v) for k, v in value.items()}


def _rank_key(key: Any) -> int:
    try:
        rank = int(key)
    except (TypeError, ValueError):
        raise ValueError("a rank key is not a number") from None
    if not 0 <= rank < 1 << 31:
        raise ValueError("a rank key is out of range")
    return rank


def _streams(value: Any) -> Dict[str, Tuple[str, ...]]:
    if not isinstance(value, Mapping):
        raise ValueError("a rank's tails are not an object")
    out: Dict[str, Tuple[str, ...]] = {}
    for stream in STREAMS:
        lines = value.get(stream) or []
        if not isinstance(lines, list) or len(lines) > TAIL_LINES or not all(isinstance(x, str) for x in lines):
            raise ValueError("a rank's %s tail is malformed" % stream)
        out[stream] = tuple(x[:TAIL_LINE_CHARS] for x in lines)
    return out


@dataclass(frozen=True)
class NodeReport(Record):
    """A node's ranks and their last lines as it finishes a call, bounded per node."""

    ERROR = ProtocolError
    ranks: Annotated[Tuple[RankStatus, ...], Items(MAX_RANKS_PER_NODE)] = ()
    tails: Annotated[Tails, Via(_tails, lambda tails: {str(r): {s: list(lines) for s, lines in streams.items()}
                                                       for r, streams in tails.items()})] = field(default_factory=dict)
    started: Annotated[Optional[float], Real(0.0, 1e12)] = None
    ended: Annotated[Optional[float], Real(0.0, 1e12)] = None
    truncated: bool = False  # cut to fit the line limit

    def cut(self) -> "NodeReport":
        """Without output tails: when the whole does not fit a line (a lost done would hang the control)."""
        return NodeReport(self.ranks[:MAX_RANKS_PER_NODE], {}, self.started, self.ended, truncated=True)


@dataclass(frozen=True)
class CallDone(GangMessage):
    """``rank0``: rank 0's pickled return value, with a MAC over its bytes; one too big is sent as its size."""

    TYPE: ClassVar[MessageType] = MessageType.CALL_DONE
    index: CallIndex
    report: Optional[NodeReport] = None
    rank0: Annotated[Optional[bytes], BASE64] = None
    rank0_proof: Annotated[Optional[str], Text(PROOF_HEX)] = None
    rank0_size: Annotated[Optional[int], Int(0, 1 << 62)] = None


@dataclass(frozen=True)
class CallAllDone(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.CALL_ALL_DONE
    index: CallIndex


@dataclass(frozen=True)
class StacksIn(GangMessage):
    """Every node still in call ``index`` sent its stacks: a node keeps its ranks alive until then,
    as a peer's ranks in a collective with them would die before their node asked where they were."""

    TYPE: ClassVar[MessageType] = MessageType.STACKS_IN
    index: CallIndex


@dataclass(frozen=True)
class Failed(GangMessage):
    """``restart``: which start of the call's ranks failed, so a report of replaced ranks is not taken for the new."""

    TYPE: ClassVar[MessageType] = MessageType.FAILED
    cause: Annotated[Cause, CAUSE]
    call: Optional[CallIndex] = None
    report: Optional[NodeReport] = None
    restart: Annotated[int, Int(0, MAX_RESTART), SKIP] = 0


@dataclass(frozen=True)
class Restart(GangMessage):
    """Start call ``index``'s ranks again on a fresh ``rdzv_port`` (the old store dies with node 0's old
    agent); ``swapped_in``: the spare that came in for the node the cause is pinned to; ``snapshot_source``:
    the node whose snapshot store that spare was told to fetch the state it lacks from (``SnapshotPeers``),
    so every node's record of the swap says whose copy the gang resumed from."""

    TYPE: ClassVar[MessageType] = MessageType.RESTART
    index: CallIndex
    restart: Annotated[int, Int(1, MAX_RESTART)]
    rdzv_port: Port
    cause: Annotated[Cause, CAUSE]
    bench: Annotated[Bench, SKIP] = Bench()
    swapped_in: Annotated[Optional[int], Int(0, MAX_NODE)] = None
    snapshot_source: Annotated[Optional[int], Int(0, MAX_NODE - 1)] = None

    @property
    def swapped_out(self) -> Optional[int]:
        return self.cause.node_index if self.swapped_in is not None else None


@dataclass(frozen=True)
class SnapshotPeers(GangMessage):
    """For start ``restart`` of call ``index``: the store this node pushes its shards to (the next active
    node's), and, for a spare brought in, the store that holds the replaced node's (``source_node``'s
    buddy's). One node's two addresses, whatever the gang's size."""

    TYPE: ClassVar[MessageType] = MessageType.SNAPSHOT_PEERS
    index: CallIndex
    restart: Annotated[int, Int(0, MAX_RESTART)] = 0
    buddy: Optional[Address] = None
    source: Optional[Address] = None
    source_node: Optional[NodeIndex] = None


def _stacks(value: Any) -> Dict[int, str]:
    """Best effort: entries that are not a rank and a text are left out, texts cut."""
    if not isinstance(value, Mapping):
        raise ValueError("not an object")
    return {rank: text[:MAX_STACK_BYTES] for rank, text in _by_rank(value) if isinstance(text, str)}


def _flights(value: Any) -> Dict[int, FlightSummary]:
    if not isinstance(value, Mapping):
        raise ValueError("not an object")
    flights: Dict[int, FlightSummary] = {}
    for rank, summary in _by_rank(value):
        try:
            flights[rank] = FlightSummary.from_wire(summary)
        except FlightError:
            continue
    return flights


def _by_rank(value: Mapping[str, Any]) -> Iterator[Tuple[int, Any]]:
    for key, item in list(value.items())[:MAX_RANKS_PER_NODE]:
        try:
            rank = int(key)
        except (TypeError, ValueError):
            continue
        if 0 <= rank < 1 << 31:
            yield rank, item


@dataclass(frozen=True)
class Stacks(GangMessage):
    """rank -> faulthandler's dump and Flight Recorder summary; both empty when the node had no live rank."""

    TYPE: ClassVar[MessageType] = MessageType.STACKS
    call: CallIndex
    stacks: Annotated[Dict[int, str], Via(_stacks), NEED] = field(default_factory=dict)
    flights: Annotated[Dict[int, FlightSummary], Via(_flights)] = field(default_factory=dict)


@dataclass(frozen=True)
class Leave(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.LEAVE
    calls: CallIndex
    ok: bool


@dataclass(frozen=True)
class AllLeft(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.ALL_LEFT


@dataclass(frozen=True)
class Abort(GangMessage):
    TYPE: ClassVar[MessageType] = MessageType.ABORT
    cause: Annotated[Cause, CAUSE]


# The preflight's (gang/node_compare.py compares; launch/node_checks.py measures).
FINGERPRINT_FIELDS = ("python", "torch", "cuda", "nccl", "cudnn", "metaflow", "metaflow_torchrun", "kernel")
FINGERPRINT_VALUE_CHARS = 64
CHECK_STATUSES = ("ok", "warn", "fail")
MAX_CHECKS = 16
CHECK_NAME_CHARS = 32
CHECK_TEXT_CHARS = 300
CheckText = Annotated[str, Text(CHECK_TEXT_CHARS)]


@dataclass(frozen=True)
class PreflightCheck(Record):
    """One fitness check on one node: the fix when it is not ok."""

    ERROR = ProtocolError
    name: Annotated[str, Text(CHECK_NAME_CHARS, least=1)]
    status: Annotated[str, OneOf(CHECK_STATUSES)]
    found: CheckText = ""
    expected: CheckText = ""
    fix: CheckText = ""


Versions = Dict[Annotated[str, OneOf(FINGERPRINT_FIELDS)], Annotated[str, Text(FINGERPRINT_VALUE_CHARS)]]


@dataclass(frozen=True)
class Preflight(GangMessage):
    """Fingerprint (read from files, never by importing torch) and checks; once, before any ``call``."""

    TYPE: ClassVar[MessageType] = MessageType.PREFLIGHT
    versions: Annotated[Versions, Items(len(FINGERPRINT_FIELDS)), NEED] = field(default_factory=dict)
    checks: Annotated[Tuple[PreflightCheck, ...], Items(MAX_CHECKS)] = ()


KINDS: Dict[MessageType, Type[GangMessage]] = {cls.TYPE: cls for cls in GangMessage.__subclasses__()}
_BY_NAME: Dict[str, Type[GangMessage]] = {kind.value: cls for kind, cls in KINDS.items()}


def parse(data: Mapping[str, Any]) -> GangMessage:
    """``ProtocolError`` for an unknown type or a field of the wrong type or size."""
    name = data.get("type")
    kind = _BY_NAME.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ProtocolError("unknown message type %r" % str(name)[:40])
    return decode(kind, data)


def parse_as(data: Mapping[str, Any], expected: Type[M]) -> M:
    message = parse(data)
    if not isinstance(message, expected):
        raise ProtocolError("expected %s, got %s" % (expected.TYPE.value, message.TYPE.value))
    return message
