"""A training-state snapshot's bytes: a JSON manifest and the tensors' raw bytes, never pickle.

    MAGIC | manifest length, data length (u64 each) | manifest | zero pad to 64 | data | sha256

The digest covers everything before it. It is written only where a snapshot leaves its node (a
push to the buddy, a copy fetched by a spare: ``digest_of`` in the store, at that time), so a copy
cut short or changed on the way is refused before a byte of it is used. On its own node a snapshot
needs none: a rank writes it into a slot the store does not treat as a snapshot until the rank
commits it, so a rank killed mid-write leaves nothing torn to read. A snapshot is read as hostile
either way (the digest is no secret): every size, dtype, shape, offset and the nesting are checked
against bounds first, on every load.

The manifest holds the state's shape (``tree``: dicts, lists, tuples and small Python values,
each tensor as its index) and each tensor's dtype, shape, offset and length in the data. Floats
are written as their 8 bytes in hex, so a NaN's payload and -0.0 come back as they went.

Imports no torch: the task reads a snapshot's manifest without it; ``plan`` and ``build`` import
torch inside (a rank already has it).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import struct
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

MAGIC = b"MFTRSNP\x01"
_SIZES = struct.Struct("!QQ")
HEADER_BYTES = len(MAGIC) + _SIZES.size
DIGEST_BYTES = 32
ALIGN = 64  # each tensor's bytes start here: any dtype can be viewed in place
FORMAT = 1

MAX_MANIFEST = 16 << 20
MAX_DEPTH = 32  # containers inside containers
MAX_NODES = 1 << 20  # values in the tree, tensors included
MAX_TENSORS = 1 << 18
MAX_DIMS = 64  # torch's own limit
MAX_ELEMENTS = 1 << 48
MAX_TEXT = 1 << 20  # one str or bytes value
MAX_INT = 1 << 64  # a Python int is kept within +-2**64
MAX_STEP = 1 << 53

# The dtypes a snapshot holds, by the name after "torch.", with their item size.
DTYPES: Dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex128": 16, "complex64": 8,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}

_KINDS = "a dict (str or int keys), a list, a tuple, a tensor, int, float, bool, str, bytes or None"


class SnapshotError(ValueError):
    """Bytes that are no whole, well-formed snapshot: never used."""


class SnapshotTypeError(TypeError):
    """A value a snapshot cannot hold, named by its key path (``state['optim']['state'][0]``)."""


@dataclass(frozen=True)
class TensorSpec:
    dtype: str
    shape: Tuple[int, ...]
    offset: int  # from the start of the data
    nbytes: int


@dataclass(frozen=True)
class Decoded:
    """A checked snapshot: its tensors are still bytes at ``data_start + spec.offset``."""

    step: int
    tree: Any  # the manifest's, checked
    specs: Tuple[TensorSpec, ...]
    data_start: int


# -- writing -------------------------------------------------------------------------


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def layout(manifest: bytes, data_bytes: int) -> Tuple[int, int]:
    """Where the data starts and the snapshot's whole length."""
    start = aligned(HEADER_BYTES + len(manifest))
    return start, start + data_bytes + DIGEST_BYTES


def write_head(buffer: memoryview, manifest: bytes, data_bytes: int) -> None:
    """The header, the manifest and the pad before the data; the data and digest are the caller's."""
    start, _ = layout(manifest, data_bytes)
    head = MAGIC + _SIZES.pack(len(manifest), data_bytes) + manifest
    buffer[:len(head)] = head
    buffer[len(head):start] = bytes(start - len(head))


def digest_of(buffer: Any, total: int) -> bytes:
    """The SHA-256 of a snapshot of ``total`` bytes: of everything before its trailer."""
    with memoryview(buffer) as view:
        return hashlib.sha256(view[:total - DIGEST_BYTES]).digest()


def seal(buffer: memoryview, total: int) -> bytes:
    """Writes the digest of ``buffer[:total - 32]`` at its end; returns it."""
    digest = digest_of(buffer, total)
    buffer[total - DIGEST_BYTES:total] = digest
    return digest


def manifest_bytes(step: int, tree: Any, specs: List[TensorSpec]) -> bytes:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < MAX_STEP:
        raise SnapshotTypeError("snapshot.save: step must be an int from 0 to 2**53, not %r" % (step,))
    body = {"format": FORMAT, "step": step, "tree": tree,
            "tensors": [[s.dtype, list(s.shape), s.offset, s.nbytes] for s in specs]}
    data = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_MANIFEST:
        raise SnapshotTypeError("snapshot.save: the state's structure takes %d bytes of manifest, over %d: "
                                "keep large values in tensors" % (len(data), MAX_MANIFEST))
    return data


def float_text(value: float) -> str:
    return struct.pack("!d", value).hex()


@dataclass
class Plan:
    """What ``save`` copies: the tree (JSON-ready), each tensor with its key path and place."""

    tree: Any
    tensors: List[Tuple[str, Any]]  # (key path, tensor)
    specs: List[TensorSpec]
    data_bytes: int


def plan(state: Any) -> Plan:
    """Every value checked here, at ``save``: what cannot be stored is named by its key path."""
    import torch

    tensors: List[Tuple[str, Any]] = []
    counter = [0]
    tree = _plan_value(state, "state", 0, tensors, counter, torch)
    specs, offset = [], 0
    for _path, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        specs.append(TensorSpec(_dtype_name(tensor), tuple(tensor.shape), offset, nbytes))
        offset = aligned(offset + nbytes)
    return Plan(tree, tensors, specs, offset)


def _plan_value(value: Any, path: str, depth: int, tensors: list, counter: list, torch: Any) -> Any:
    counter[0] += 1
    if counter[0] > MAX_NODES:
        raise SnapshotTypeError("snapshot.save: the state holds over %d values" % MAX_NODES)
    if depth > MAX_DEPTH:
        raise SnapshotTypeError("snapshot.save: %s is nested over %d containers deep" % (path, MAX_DEPTH))
    if isinstance(value, torch.Tensor):
        tensors.append((path, _storable_tensor(value, path, torch)))
        if len(tensors) > MAX_TENSORS:
            raise SnapshotTypeError("snapshot.save: the state holds over %d tensors" % MAX_TENSORS)
        return {"t": len(tensors) - 1}
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            if isinstance(key, bool) or not isinstance(key, (str, int)) or (isinstance(key, int) and not
                                                                          -MAX_INT < key < MAX_INT):
                raise SnapshotTypeError("snapshot.save: %s has a key %r of type %s; a snapshot's dict keys are "
                                        "str or int" % (path, key, type(key).__name__))
            items.append([key, _plan_value(item, "%s[%r]" % (path, key), depth + 1, tensors, counter, torch)])
        return {"d": items}
    if type(value) in (list, tuple):
        inner = [_plan_value(item, "%s[%d]" % (path, i), depth + 1, tensors, counter, torch)
                 for i, item in enumerate(value)]
        return inner if type(value) is list else {"u": inner}
    return _plan_scalar(value, path)


def _plan_scalar(value: Any, path: str) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if type(value) is int:
        if not -MAX_INT < value < MAX_INT:
            raise SnapshotTypeError("snapshot.save: %s is an int beyond +-2**64" % path)
        return value
    if isinstance(value, float):
        return {"f": float_text(float(value))}
    if type(value) is str:
        if len(value) > MAX_TEXT:
            raise SnapshotTypeError("snapshot.save: %s is a str of %d characters, over %d" % (path, len(value),
                                                                                        MAX_TEXT))
        return value
    if type(value) is bytes:
        if len(value) > MAX_TEXT:
            raise SnapshotTypeError("snapshot.save: %s is bytes of %d, over %d: keep it in a uint8 tensor"
                                    % (path, len(value), MAX_TEXT))
        return {"b": base64.b64encode(value).decode("ascii")}
    raise SnapshotTypeError("snapshot.save: %s is a %s.%s, which a snapshot cannot hold; it holds %s"
                            % (path, type(value).__module__, type(value).__qualname__, _KINDS))


def _storable_tensor(tensor: Any, path: str, torch: Any) -> Any:
    if hasattr(tensor, "to_local") and hasattr(tensor, "placements"):
        tensor = tensor.to_local()  # a DTensor: this rank's shard
    if tensor.layout != torch.strided:
        raise SnapshotTypeError("snapshot.save: %s is a %s tensor; a snapshot holds dense (strided) tensors"
                                % (path, tensor.layout))
    if tensor.device.type == "meta":
        raise SnapshotTypeError("snapshot.save: %s is on the meta device: it holds no data" % path)
    if _dtype_name(tensor) not in DTYPES:
        raise SnapshotTypeError("snapshot.save: %s has dtype %s; a snapshot holds %s"
                                % (path, tensor.dtype, ", ".join(sorted(DTYPES))))
    return tensor.detach()


def _dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).rpartition(".")[2]


# -- reading -------------------------------------------------------------------------


def check(blob: Any, digest: bool = True) -> Decoded:
    """The digest first (unless ``digest`` is False: a snapshot that never left its node), then every
    bound; a ``SnapshotError`` names the first thing wrong."""
    view = memoryview(blob).cast("B")
    if len(view) < HEADER_BYTES + DIGEST_BYTES or bytes(view[:len(MAGIC)]) != MAGIC:
        raise SnapshotError("not a snapshot (no header)")
    manifest_len, data_len = _SIZES.unpack(view[len(MAGIC):HEADER_BYTES])
    if manifest_len > MAX_MANIFEST:
        raise SnapshotError("a manifest of %d bytes, over %d" % (manifest_len, MAX_MANIFEST))
    start = aligned(HEADER_BYTES + manifest_len)
    if start + data_len + DIGEST_BYTES != len(view):
        raise SnapshotError("%d bytes where the header says %d: cut short or padded"
                            % (len(view), start + data_len + DIGEST_BYTES))
    if digest and not hmac.compare_digest(hashlib.sha256(view[:len(view) - DIGEST_BYTES]).digest(),
                                          bytes(view[len(view) - DIGEST_BYTES:])):
        raise SnapshotError("the digest does not match: the snapshot is torn or changed")
    manifest = _parse(bytes(view[HEADER_BYTES:HEADER_BYTES + manifest_len]))
    specs = _specs(manifest.get("tensors"), data_len)
    step = manifest.get("step")
    if manifest.get("format") != FORMAT or not isinstance(step, int) or isinstance(step, bool) or \
            not 0 <= step < MAX_STEP:
        raise SnapshotError("not a snapshot of format %d with a step" % FORMAT)
    if any(view[start + s.offset:start + s.offset + s.nbytes].tobytes().translate(None, b"\0\1")
           for s in specs if s.dtype == "bool"):
        raise SnapshotError("a bool tensor holds a byte other than 0 or 1")
    tree = manifest.get("tree")
    rebuild(tree, lambda i: i, len(specs))  # checked whole before any tensor is made
    return Decoded(step, tree, specs, start)


def _parse(data: bytes) -> Dict[str, Any]:
    try:
        manifest = json.loads(data, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise SnapshotError("the manifest is not JSON") from None
    if not isinstance(manifest, dict):
        raise SnapshotError("the manifest is not a JSON object")
    return manifest


def _no_constant(name: str) -> Any:
    raise ValueError("%s is not JSON" % name)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _specs(raw: Any, data_len: int) -> Tuple[TensorSpec, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_TENSORS:
        raise SnapshotError("the manifest's tensors are not a list of at most %d" % MAX_TENSORS)
    specs, end = [], 0
    for i, item in enumerate(raw):
        spec = _spec(item, i)
        if spec.offset < end or spec.offset + spec.nbytes > data_len:
            raise SnapshotError("tensor %d's bytes (%d..%d) overlap another's or lie outside the data (%d)"
                                % (i, spec.offset, spec.offset + spec.nbytes, data_len))
        end = spec.offset + spec.nbytes
        specs.append(spec)
    return tuple(specs)


def _spec(item: Any, i: int) -> TensorSpec:
    if not (isinstance(item, list) and len(item) == 4):
        raise SnapshotError("tensor %d is not [dtype, shape, offset, length]" % i)
    dtype, shape, offset, nbytes = item
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise SnapshotError("tensor %d has dtype %.40r, not one a snapshot holds" % (i, dtype))
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_is_int(d) and 0 <= d < MAX_ELEMENTS
                                                                        for d in shape):
        raise SnapshotError("tensor %d's shape is not a list of at most %d sizes" % (i, MAX_DIMS))
    elements = math.prod(shape)
    if elements >= MAX_ELEMENTS or not (_is_int(offset) and _is_int(nbytes) and 0 <= offset < MAX_ELEMENTS):
        raise SnapshotError("tensor %d's size or offset is out of range" % i)
    if nbytes != elements * DTYPES[dtype] or offset % ALIGN:
        raise SnapshotError("tensor %d's length %d does not fit its shape and dtype, or its offset is unaligned"
                            % (i, nbytes))
    return TensorSpec(dtype, tuple(shape), offset, nbytes)


def rebuild(node: Any, tensor: Callable[[int], Any], tensors: int, depth: int = 0,
            count: Optional[List[int]] = None) -> Any:
    """The state from the manifest's tree, ``tensor(i)`` standing for each tensor; strictly bounded."""
    count = count if count is not None else [0]
    count[0] += 1
    if count[0] > MAX_NODES or depth > MAX_DEPTH + 1:
        raise SnapshotError("the tree is larger or deeper than a snapshot's bounds")
    if node is None or isinstance(node, (bool, str)):
        if isinstance(node, str) and len(node) > MAX_TEXT:
            raise SnapshotError("a str over %d characters" % MAX_TEXT)
        return node
    if _is_int(node):
        if not -MAX_INT < node < MAX_INT:
            raise SnapshotError("an int beyond +-2**64")
        return node
    if isinstance(node, list):
        return [rebuild(item, tensor, tensors, depth + 1, count) for item in node]
    if isinstance(node, dict) and len(node) == 1:
        (tag, value), = node.items()
        return _tagged(tag, value, tensor, tensors, depth, count)
    raise SnapshotError("a tree node of type %s" % type(node).__name__)


def _tagged(tag: str, value: Any, tensor: Callable[[int], Any], tensors: int, depth: int, count: List[int]) -> Any:
    if tag == "t" and _is_int(value) and 0 <= value < tensors:
        return tensor(value)
    if tag == "f" and isinstance(value, str) and len(value) == 16:
        try:
            return struct.unpack("!d", bytes.fromhex(value))[0]
        except ValueError:
            raise SnapshotError("a float that is not 16 hex digits") from None
    if tag == "b" and isinstance(value, str) and len(value) <= MAX_TEXT * 4 // 3 + 4:
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            raise SnapshotError("bytes that are not base64") from None
    if tag == "u" and isinstance(value, list):
        return tuple(rebuild(item, tensor, tensors, depth + 1, count) for item in value)
    if tag == "d" and isinstance(value, list):
        out: Dict[Any, Any] = {}
        for pair in value:
            if not (isinstance(pair, list) and len(pair) == 2 and (isinstance(pair[0], str) or _is_int(pair[0]))):
                raise SnapshotError("a dict entry that is not [str or int key, value]")
            out[pair[0]] = rebuild(pair[1], tensor, tensors, depth + 1, count)
        return out
    raise SnapshotError("a tree node tagged %.20r that does not hold to its form" % (tag,))


def build(blob: Any, decoded: Decoded) -> Tuple[int, Any]:
    """The state with CPU tensors of their own, copied out of ``blob``: a view into one buffer is not what
    every torch function takes (``torch.set_rng_state`` on one crashed the process), nor what a user
    keeping one tensor expects to hold the whole snapshot's memory. Once, at a restart."""
    import torch

    whole = torch.frombuffer(blob, dtype=torch.uint8) if len(blob) else torch.empty(0, dtype=torch.uint8)

    def tensor(i: int) -> Any:
        spec = decoded.specs[i]
        dtype = getattr(torch, spec.dtype)
        if spec.nbytes == 0:
            return torch.empty(spec.shape, dtype=dtype)
        begin = decoded.data_start + spec.offset
        return whole[begin:begin + spec.nbytes].view(dtype).view(spec.shape).clone()

    return decoded.step, rebuild(decoded.tree, tensor, len(decoded.specs))
