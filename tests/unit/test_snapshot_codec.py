"""A snapshot's bytes: every dtype back bit for bit, and a hostile snapshot refused before use."""

import json
import math
import struct

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import codec
from lazy_torch import torch


def encode(step, state):
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank.saver import encode as whole

    return whole(step, state)


def decode(blob):
    return codec.build(blob, codec.check(blob))


def same_bits(a, b):
    """Equal as bytes: NaN payloads, -0.0 and every bool byte count."""
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.numel() == 0:
        return True
    return bytes(a.contiguous().reshape(-1).view(torch.uint8).tolist()) == \
        bytes(b.contiguous().reshape(-1).view(torch.uint8).tolist())


DTYPES = ["float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool",
          "complex64", "float8_e4m3fn"]


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_every_dtype_comes_back_bit_for_bit(dtype_name):
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(1)
    raw = torch.randint(0, 256, (7, 8 * 16), dtype=torch.uint8, generator=gen)  # any bit pattern, NaNs too
    tensor = (raw % 2).bool() if dtype == torch.bool else raw.view(dtype)
    step, state = decode(encode(5, {"t": tensor}))
    assert step == 5 and same_bits(state["t"], tensor)


def test_non_contiguous_zero_size_and_scalar_tensors():
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    state = {"transposed": base.t(), "strided": base[::2, 1::3], "empty": torch.zeros(0, 5),
             "empty_bf16": torch.ones(3, 0, dtype=torch.bfloat16), "scalar": torch.tensor(-0.0),
             "expanded": torch.tensor([1.5]).expand(4)}
    _, back = decode(encode(0, state))
    for name, tensor in state.items():
        assert same_bits(back[name], tensor), name
        assert back[name].is_contiguous()


def test_lazy_conjugate_and_negative_views_are_stored_as_their_values():
    z = torch.complex(torch.arange(4.0), torch.arange(4.0) + 10)
    state = {"conj": z.conj(), "neg": z.conj().imag, "plain": z}
    assert state["conj"].is_conj() and state["neg"].is_neg() and state["conj"].is_contiguous()
    _, back = decode(encode(0, state))
    assert torch.equal(back["conj"], z.conj().resolve_conj()) and torch.equal(back["neg"], -(z.imag))
    assert torch.equal(back["plain"], z) and not back["conj"].is_conj()


def test_python_values_and_containers_come_back_as_they_went():
    nan = struct.unpack("!d", bytes.fromhex("7ff8000000000123"))[0]  # a NaN with a payload
    state = {"ints": [0, -1, 2**63, -(2**64) + 1], "floats": (1.5, -0.0, float("inf"), nan),
             "text": "héllo", "raw": b"\x00\xff", "none": None, "flags": [True, False],
             3: {"nested": ({"deep": [torch.ones(2)]},)}, "empty": {}, "empty_list": [], "empty_tuple": ()}
    _, back = decode(encode(1, state))
    assert back["ints"] == state["ints"] and back["text"] == "héllo" and back["raw"] == b"\x00\xff"
    assert back["none"] is None and back["flags"] == [True, False] and isinstance(back["flags"][0], bool)
    assert [struct.pack("!d", f) for f in back["floats"]] == [struct.pack("!d", f) for f in state["floats"]]
    assert isinstance(back["floats"], tuple) and math.copysign(1, back["floats"][1]) == -1
    assert torch.equal(back[3]["nested"][0]["deep"][0], torch.ones(2))
    assert back["empty"] == {} and back["empty_list"] == [] and back["empty_tuple"] == ()


def test_a_models_and_optimizers_state_dicts_round_trip():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    _, back = decode(encode(9, {"model": model.state_dict(), "opt": opt.state_dict()}))
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    fresh.load_state_dict(back["model"])
    for a, b in zip(fresh.state_dict().values(), model.state_dict().values()):
        assert same_bits(a, b)
    fresh_opt = torch.optim.Adam(fresh.parameters())
    fresh_opt.load_state_dict(back["opt"])
    assert same_bits(fresh_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


# -- what save refuses, named by its key path --------------------------------------------


@pytest.mark.parametrize("value, words", [
    ({"a": {"b": [1, object()]}}, "state['a']['b'][1] is a builtins.object"),
    ({"opt": {"s": {1, 2}}}, "state['opt']['s'] is a builtins.set"),
    ({"x": {True: 1}}, "state['x'] has a key True"),
    ({"x": {(1, 2): 1}}, "has a key (1, 2)"),
    ({"big": 2**70}, "state['big'] is an int beyond"),
    (lambda: {"s": torch.zeros(3, 3).to_sparse()}, "state['s'] is a torch.sparse_coo tensor"),
    (lambda: {"m": torch.empty(2, device="meta")}, "state['m'] is on the meta device"),
    (lambda: {"u": torch.zeros(2, dtype=torch.uint16)}, "state['u'] has dtype torch.uint16"),
])
def test_save_names_what_it_cannot_hold(value, words):
    with pytest.raises(codec.SnapshotTypeError) as caught:
        codec.plan(value() if callable(value) else value)
    assert words in str(caught.value)


def test_nesting_past_the_bound_is_named():
    deep = leaf = []
    for _ in range(codec.MAX_DEPTH + 2):
        leaf.append([])
        leaf = leaf[0]
    with pytest.raises(codec.SnapshotTypeError, match="nested over 32 containers deep"):
        codec.plan(deep)


def test_a_step_that_is_no_count_is_refused():
    with pytest.raises(codec.SnapshotTypeError, match="step must be an int"):
        encode(-1, {})
    with pytest.raises(codec.SnapshotTypeError, match="step must be an int"):
        encode(True, {})


# -- hostile bytes ---------------------------------------------------------------------


def forge(manifest, data=b"", raw_manifest=None):
    """A snapshot whose digest holds (anyone can compute it) around whatever manifest is given."""
    body = raw_manifest if raw_manifest is not None else json.dumps(manifest).encode()
    start, total = codec.layout(body, len(data))
    blob = bytearray(total)
    codec.write_head(memoryview(blob), body, len(data))
    blob[start:start + len(data)] = data
    codec.seal(memoryview(blob), total)
    return blob


def good(**changes):
    manifest = {"format": 1, "step": 3, "tree": {"d": [["w", {"t": 0}]]}, "tensors": [["float32", [2], 0, 8]]}
    manifest.update(changes)
    return manifest


def test_a_forged_snapshot_that_holds_to_the_form_is_read():
    step, state = decode(forge(good(), struct.pack("<2f", 1.0, 2.0)))
    assert step == 3 and state["w"].tolist() == [1.0, 2.0]


@pytest.mark.parametrize("manifest, words", [
    (good(tensors=[["object", [2], 0, 8]]), "dtype 'object'"),
    (good(tensors=[["float32", [2], 0, 12]]), "does not fit its shape"),
    (good(tensors=[["float32", [-2], 0, 8]]), "shape is not a list"),
    (good(tensors=[["float32", [1] * 65, 0, 4]]), "shape is not a list"),
    (good(tensors=[["float32", [2], 64, 8]]), "outside the data"),
    (good(tensors=[["float32", [2], 3, 8]]), "unaligned"),
    (good(tensors=[["float32", [2], 0, 8], ["float32", [1], 0, 4]], tree=[{"t": 0}, {"t": 1}]), "overlap"),
    (good(tensors=[["float32", [1 << 47, 1 << 47], 0, 8]]), "out of range"),
    (good(tensors="no"), "tensors are not a list"),
    (good(tree={"t": 1}), "does not hold to its form"),
    (good(tree={"f": "zz" * 8}), "not 16 hex digits"),
    (good(tree={"b": "!!"}), "not base64"),
    (good(tree={"q": 1}), "tagged 'q'"),
    (good(tree={"d": [[1.5, 2]]}), "a dict entry"),
    (good(tree=2**65), "beyond"),
    (good(tree=1.5), "a tree node of type float"),
    (good(step=-1), "with a step"),
    (good(step=True), "with a step"),
    (good(format=2), "format 1"),
])
def test_a_manifest_out_of_bounds_is_refused(manifest, words):
    with pytest.raises(codec.SnapshotError) as caught:
        codec.check(forge(manifest, bytes(8)))
    assert words in str(caught.value)


MESH = ["cpu", [2, 2], [0, 1, 2, 3], ["dp", "shard"]]


def sharded(mesh=MESH, dt=(0, 0, [["R"], ["S", 0]], [8], [1]), shard=2):
    """A forged snapshot of one DTensor: a float32 shard of ``shard`` elements, placed on ``mesh``."""
    return good(tree={"ms": [[mesh], {"d": [["w", {"dt": list(dt)}]]}]}, tensors=[["float32", [shard], 0, 4 * shard]])


def test_a_forged_dtensor_that_holds_to_the_form_is_read_with_its_mesh_and_placements():
    blob = forge(sharded(), struct.pack("<2f", 1.0, 2.0))
    decoded = codec.check(blob, world=4)
    assert decoded.meshes == (codec.MeshForm("cpu", (2, 2), (0, 1, 2, 3), ("dp", "shard")),)
    seen = []
    _, state = codec.build(blob, decoded, lambda local, form, mesh: seen.append((form, mesh)) or "rebuilt")
    assert state == {"w": "rebuilt"} and seen == [(codec.DTensorForm(0, (("R",), ("S", 0)), (8,), (1,)),
                                                   decoded.meshes[0])]
    assert codec.build(blob, decoded)[1]["w"].tolist() == [1.0, 2.0]  # without a maker: the plain shard


@pytest.mark.parametrize("manifest, world, words", [
    (sharded(), 2, "holds ranks [0, 1, 2, 3], not each of this gang's 2 once"),
    (sharded(mesh=["cpu", [2, 2], [0, 1, 1, 3], None]), 4, "not each of this gang's 4 once"),
    (sharded(mesh=["cpu", [2, 2], [0, 1, 2], None]), None, "shape and ranks do not agree"),
    (sharded(mesh=["CPU;", [4], [0, 1, 2, 3], None]), None, "not [device type, shape, ranks, names]"),
    (sharded(mesh=["cpu", [4], [0, 1, 2, 3], ["a", "b"]]), None, "names are not one short str a dimension"),
    (sharded(dt=(0, 1, [["R"], ["S", 0]], [8], [1])), None, "a mesh the snapshot does not name"),
    (sharded(dt=(0, 0, [["S", 0]], [8], [1])), None, "a mesh the snapshot does not name"),
    (sharded(dt=(0, 0, [["R"], ["S", 0]], [8], [1]), shard=9), None, "does not fit in its DTensor's shape"),
    (sharded(dt=(0, 0, [["R"], ["S", 1]], [8], [1])), None, "placement ['S', 1]"),
    (sharded(dt=(0, 0, [["R"], ["P", "sum"]], [8], [1])), None, "placement ['P', 'sum']"),
    (sharded(dt=(0, 0, [["R"], ["SS", 0, 0]], [8], [1])), None, "placement ['SS', 0, 0]"),
    (sharded(dt=(0, 0, [["R"], ["S", 0]], [8], [1, 1])), None, "shape or stride is out of range"),
    (sharded(dt=(1, 0, [["R"], ["S", 0]], [8], [1])), None, "names tensor 1 of 1"),
    (good(tree={"ms": [[], {"t": 0}]}), None, "a list of 1 to 64"),
    (good(tree=[{"ms": [[MESH], {"t": 0}]}]), None, "tagged 'ms'"),  # meshes at the root only
])
def test_a_dtensor_out_of_bounds_is_refused(manifest, world, words):
    with pytest.raises(codec.SnapshotError) as caught:
        codec.check(forge(manifest, bytes(4 * manifest["tensors"][0][1][0])), world=world)
    assert words in str(caught.value)


def test_nesting_and_size_bounds_hold_against_a_forged_manifest():
    deep = {"format": 1, "step": 0, "tensors": [], "tree": 0}
    text = json.dumps(deep).replace('"tree": 0', '"tree": ' + "[" * 100 + "]" * 100)
    with pytest.raises(codec.SnapshotError, match="larger or deeper"):
        codec.check(forge(None, b"", raw_manifest=text.encode()))
    very_deep = json.dumps(deep).replace('"tree": 0', '"tree": ' + "[" * 100000 + "]" * 100000)
    with pytest.raises(codec.SnapshotError):
        codec.check(forge(None, b"", raw_manifest=very_deep.encode()))
    for raw in (b"[1]", b"not json", b'{"step": NaN}'):
        with pytest.raises(codec.SnapshotError):
            codec.check(forge(None, b"", raw_manifest=raw))


def test_a_bool_tensor_holding_another_byte_is_refused():
    manifest = good(tensors=[["bool", [2], 0, 2]])
    codec.check(forge(manifest, b"\x01\x00"))
    with pytest.raises(codec.SnapshotError, match="other than 0 or 1"):
        codec.check(forge(manifest, b"\x01\x02"))


def test_a_torn_or_changed_snapshot_is_refused_before_its_manifest_is_read():
    blob = encode(4, {"w": torch.arange(100, dtype=torch.float32)})
    codec.check(blob)
    for cut in (len(blob) - 1, len(blob) // 2, 40, 10, 0):
        with pytest.raises(codec.SnapshotError):
            codec.check(blob[:cut])
    for where in (0, 9, 30, len(blob) // 2, len(blob) - 40, len(blob) - 1):
        changed = bytearray(blob)
        changed[where] ^= 0x01
        with pytest.raises(codec.SnapshotError):
            codec.check(changed)
    with pytest.raises(codec.SnapshotError, match="cut short or padded"):
        codec.check(blob + b"\0")


def test_a_header_announcing_a_huge_manifest_is_refused_without_reading_it():
    blob = bytearray(codec.MAGIC + struct.pack("!QQ", codec.MAX_MANIFEST + 1, 0) + bytes(40))
    with pytest.raises(codec.SnapshotError, match="a manifest of"):
        codec.check(blob)


def test_a_loaded_tensor_owns_its_memory_and_sets_the_rng():
    """Not a view into the snapshot's buffer: torch.set_rng_state took one and crashed the process."""
    rng = torch.get_rng_state()
    _, state = decode(encode(3, {"rng": rng, "w": torch.arange(6.0)}))
    assert state["rng"]._base is None and state["w"]._base is None
    assert state["rng"].untyped_storage().nbytes() == rng.numel()  # not the whole snapshot's bytes
    torch.set_rng_state(state["rng"])
    assert torch.equal(torch.get_rng_state(), rng)
