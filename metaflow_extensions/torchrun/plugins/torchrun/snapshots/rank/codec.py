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
A DTensor (FSDP2's parameters and their optimizer state) is kept as its rank's shard, with where the
shard sits beside its index in the tree (its mesh, placements, global shape and stride; the tree
then names its meshes once, at its root), so that ``load`` gives back a DTensor (``dtensors``):
a plain tensor of the shard's shape is what FSDP2's ``load_state_dict`` refuses.

Imports no torch: the task reads a snapshot's manifest without it; ``plan`` and ``build`` import
torch inside (a rank already has it).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import re
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
MAX_MESHES = 64  # device meshes one snapshot names
MAX_MESH_RANKS = 1 << 20

# A DTensor's placements a snapshot keeps, by tag, with the number of int arguments each takes:
# Shard(dim), Replicate(), _StridedShard(dim, split_factor) (FSDP2 over tensor parallelism).
PLACEMENTS = {"S": 1, "R": 0, "SS": 2}

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
class MeshForm:
    """A device mesh as a snapshot names it: its device type, shape, ranks (flat, in the mesh's order) and
    dimension names. A snapshot holds only meshes with every rank of its gang once, so every rank
    rebuilds the same meshes at a load, each from its own snapshot."""

    device: str
    shape: Tuple[int, ...]
    ranks: Tuple[int, ...]
    names: Optional[Tuple[str, ...]]


@dataclass(frozen=True)
class DTensorForm:
    """Where a DTensor's shard sits: its mesh (an index into the snapshot's meshes), placements (one per
    mesh dimension, as in ``PLACEMENTS``), and the whole tensor's shape and stride."""

    mesh: int
    placements: Tuple[Tuple[Any, ...], ...]
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]


@dataclass(frozen=True)
class Decoded:
    """A checked snapshot: its tensors are still bytes at ``data_start + spec.offset``."""

    step: int
    tree: Any  # the manifest's, checked
    specs: Tuple[TensorSpec, ...]
    data_start: int
    meshes: Tuple[MeshForm, ...] = ()


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


@dataclass
class _Walk:
    """What ``plan`` gathers as it walks a state."""

    torch: Any
    replicated: bool
    tensors: List[Tuple[str, Any]]
    meshes: List[MeshForm]
    mesh_index: Dict[int, int]  # id(DeviceMesh) -> its index in meshes, while the state is alive
    count: int = 0


def plan(state: Any, replicated: bool = False) -> Plan:
    """Every value checked here, at ``save``: what cannot be stored is named by its key path.
    ``replicated``: the state is every rank's alike, so a DTensor sharded across ranks is refused."""
    import torch

    walk = _Walk(torch, replicated, [], [], {})
    tree = _plan_value(state, "state", 0, walk)
    if walk.meshes:
        tree = {"ms": [[_mesh_json(m) for m in walk.meshes], tree]}
    specs, offset = [], 0
    for _path, tensor in walk.tensors:
        nbytes = tensor.numel() * tensor.element_size()
        specs.append(TensorSpec(_dtype_name(tensor), tuple(tensor.shape), offset, nbytes))
        offset = aligned(offset + nbytes)
    return Plan(tree, walk.tensors, specs, offset)


def _mesh_json(mesh: MeshForm) -> list:
    return [mesh.device, list(mesh.shape), list(mesh.ranks), list(mesh.names) if mesh.names is not None else None]


def _plan_value(value: Any, path: str, depth: int, walk: _Walk) -> Any:
    walk.count += 1
    if walk.count > MAX_NODES:
        raise SnapshotTypeError("snapshot.save: the state holds over %d values" % MAX_NODES)
    if depth > MAX_DEPTH:
        raise SnapshotTypeError("snapshot.save: %s is nested over %d containers deep" % (path, MAX_DEPTH))
    if isinstance(value, walk.torch.Tensor):
        return _plan_tensor(value, path, walk)
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            if isinstance(key, bool) or not isinstance(key, (str, int)) or (isinstance(key, int) and not
                                                                          -MAX_INT < key < MAX_INT):
                raise SnapshotTypeError("snapshot.save: %s has a key %r of type %s; a snapshot's dict keys are "
                                        "str or int" % (path, key, type(key).__name__))
            items.append([key, _plan_value(item, "%s[%r]" % (path, key), depth + 1, walk)])
        return {"d": items}
    if type(value) in (list, tuple):
        inner = [_plan_value(item, "%s[%d]" % (path, i), depth + 1, walk) for i, item in enumerate(value)]
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


def _plan_tensor(value: Any, path: str, walk: _Walk) -> Any:
    form = None
    if hasattr(value, "to_local") and hasattr(value, "placements") and hasattr(value, "device_mesh"):
        from . import dtensors  # torch's side of a DTensor, imported where there is one

        value, form = dtensors.describe(value, path, walk.replicated, walk.meshes, walk.mesh_index)
    walk.tensors.append((path, _storable_tensor(value, path, walk.torch)))
    if len(walk.tensors) > MAX_TENSORS:
        raise SnapshotTypeError("snapshot.save: the state holds over %d tensors" % MAX_TENSORS)
    index = len(walk.tensors) - 1
    if form is None:
        return {"t": index}
    return {"dt": [index, form.mesh, [list(p) for p in form.placements], list(form.shape), list(form.stride)]}


def _storable_tensor(tensor: Any, path: str, torch: Any) -> Any:
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


def check(blob: Any, digest: bool = True, world: Optional[int] = None) -> Decoded:
    """The digest first (unless ``digest`` is False: a snapshot that never left its node), then every
    bound; a ``SnapshotError`` names the first thing wrong. With ``world``, a DTensor's mesh must hold
    every rank of a gang of that size once (a shard of another gang's layout is no shard of this one's)."""
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
    meshes, tree = _meshes(manifest.get("tree"), world)
    rebuild(tree, _form_check(specs, meshes), len(specs))  # checked whole before any tensor is made
    return Decoded(step, tree, specs, start, meshes)


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


TensorMaker = Callable[[int, Optional[DTensorForm]], Any]
_DEVICE = re.compile(r"[a-z][a-z0-9_]{0,15}\Z")
MAX_NAME = 64  # a mesh dimension's name


def _meshes(tree: Any, world: Optional[int]) -> Tuple[Tuple[MeshForm, ...], Any]:
    """The meshes a tree names at its root (a state with DTensors), checked, and the state's own tree."""
    if not (isinstance(tree, dict) and list(tree) == ["ms"]):
        return (), tree
    value = tree["ms"]
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], list)
            and 0 < len(value[0]) <= MAX_MESHES):
        raise SnapshotError("the tree's meshes are not a list of 1 to %d beside the state" % MAX_MESHES)
    return tuple(_mesh(raw, i, world) for i, raw in enumerate(value[0])), value[1]


def _mesh(raw: Any, i: int, world: Optional[int]) -> MeshForm:
    if not (isinstance(raw, list) and len(raw) == 4 and isinstance(raw[0], str) and _DEVICE.match(raw[0])):
        raise SnapshotError("mesh %d is not [device type, shape, ranks, names]" % i)
    device, shape, ranks, names = raw
    if not (_ints(shape, 1, MAX_MESH_RANKS) and 0 < len(shape) <= MAX_DIMS and _ints(ranks, 0, MAX_MESH_RANKS)
            and len(ranks) == math.prod(shape) <= MAX_MESH_RANKS):
        raise SnapshotError("mesh %d's shape and ranks do not agree or are out of range" % i)
    if names is not None and not (isinstance(names, list) and len(names) == len(shape) and all(
            isinstance(n, str) and 0 < len(n) <= MAX_NAME for n in names)):
        raise SnapshotError("mesh %d's dimension names are not one short str a dimension" % i)
    if world is not None and sorted(ranks) != list(range(world)):
        raise SnapshotError("mesh %d holds ranks %s, not each of this gang's %d once: a shard of another "
                            "layout" % (i, _brief(ranks), world))
    return MeshForm(device, tuple(shape), tuple(ranks), tuple(names) if names is not None else None)


def _ints(value: Any, low: int, high: int) -> bool:
    return isinstance(value, list) and all(_is_int(v) and low <= v < high for v in value)


def _brief(ranks: List[int]) -> str:
    return str(ranks) if len(ranks) <= 8 else "[%s, ...] (%d)" % (", ".join(map(str, ranks[:8])), len(ranks))


def _dtensor_form(value: Any) -> Tuple[int, DTensorForm]:
    """A tree's ``{"dt": [index, mesh, placements, shape, stride]}``, its forms checked (the mesh and the
    shard's own shape, by ``_form_check``)."""
    if not (isinstance(value, list) and len(value) == 5 and _is_int(value[0]) and _is_int(value[1])
            and isinstance(value[2], list) and 0 < len(value[2]) <= MAX_DIMS):
        raise SnapshotError("a DTensor that is not [tensor, mesh, placements, shape, stride]")
    index, mesh, placements, shape, stride = value
    if not (_ints(shape, 0, MAX_ELEMENTS) and _ints(stride, 0, MAX_ELEMENTS) and len(shape) == len(stride)
            <= MAX_DIMS and math.prod(shape) < MAX_ELEMENTS):
        raise SnapshotError("a DTensor's shape or stride is out of range")
    for placement in placements:
        if not (isinstance(placement, list) and placement and placement[0] in PLACEMENTS
                and len(placement) == 1 + PLACEMENTS[placement[0]] and _ints(placement[1:], 0, MAX_ELEMENTS)
                and (len(placement) == 1 or placement[1] < len(shape)) and placement[2:] != [0]):
            raise SnapshotError("a DTensor placement %.40r that a snapshot does not keep" % (placement,))
    return index, DTensorForm(mesh, tuple(tuple(p) for p in placements), tuple(shape), tuple(stride))


def _form_check(specs: Tuple[TensorSpec, ...], meshes: Tuple[MeshForm, ...]) -> TensorMaker:
    """The check of each DTensor against its mesh and its shard: a shard no larger than the whole."""
    def tensor(i: int, form: Optional[DTensorForm]) -> int:
        if form is None:
            return i
        if not form.mesh < len(meshes) or len(form.placements) != len(meshes[form.mesh].shape):
            raise SnapshotError("tensor %d is placed on a mesh the snapshot does not name" % i)
        local = specs[i].shape
        if len(local) != len(form.shape) or any(mine > whole for mine, whole in zip(local, form.shape)):
            raise SnapshotError("tensor %d's shard %s does not fit in its DTensor's shape %s"
                                % (i, list(local), list(form.shape)))
        return i

    return tensor


def rebuild(node: Any, tensor: TensorMaker, tensors: int, depth: int = 0,
            count: Optional[List[int]] = None) -> Any:
    """The state from the manifest's tree, ``tensor(i, form)`` standing for each tensor (``form`` a
    DTensor's, else None); strictly bounded."""
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


def _tagged(tag: str, value: Any, tensor: TensorMaker, tensors: int, depth: int, count: List[int]) -> Any:
    if tag == "t" and _is_int(value) and 0 <= value < tensors:
        return tensor(value, None)
    if tag == "dt":
        index, form = _dtensor_form(value)
        if not 0 <= index < tensors:
            raise SnapshotError("a DTensor names tensor %d of %d" % (index, tensors))
        return tensor(index, form)
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


DTensorMaker = Callable[[Any, DTensorForm, MeshForm], Any]


def build(blob: Any, decoded: Decoded, dtensor: Optional[DTensorMaker] = None) -> Tuple[int, Any]:
    """The state with CPU tensors of their own, copied out of ``blob``: a view into one buffer is not what
    every torch function takes (``torch.set_rng_state`` on one crashed the process), nor what a user
    keeping one tensor expects to hold the whole snapshot's memory. Once, at a restart. A DTensor's
    shard is handed to ``dtensor`` with its form and mesh (``dtensors.rebuild``); without it, it stays
    the plain shard."""
    import torch

    whole = torch.frombuffer(blob, dtype=torch.uint8) if len(blob) else torch.empty(0, dtype=torch.uint8)

    def tensor(i: int, form: Optional[DTensorForm]) -> Any:
        spec = decoded.specs[i]
        dtype = getattr(torch, spec.dtype)
        if spec.nbytes == 0:
            local = torch.empty(spec.shape, dtype=dtype)
        else:
            begin = decoded.data_start + spec.offset
            local = whole[begin:begin + spec.nbytes].view(dtype).view(spec.shape).clone()
        if form is None or dtensor is None:
            return local
        return dtensor(local, form, decoded.meshes[form.mesh])

    return decoded.step, rebuild(decoded.tree, tensor, len(decoded.specs))
