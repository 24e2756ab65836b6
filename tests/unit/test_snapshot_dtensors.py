"""DTensors through a rank's save and load against a real store in this process: FSDP2's state on a real
gloo group of one rank (the gang of 4 is tests/integration/test_snapshot_restarts.py's FSDP2 flow)."""

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import api as snapshot
from lazy_torch import torch
from test_snapshot_rank import store  # noqa: F401 (a fixture)


@pytest.fixture
def group():
    """A real gloo process group of one rank, gone after the test."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


def fsdp_model(seed):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 1))
    for layer in (model[0], model[2], model):
        fully_shard(layer)
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def trained(seed):
    model, opt = fsdp_model(seed)
    model(torch.randn(4, 6)).sum().backward()
    opt.step()
    return model, opt


def test_fsdp2_state_comes_back_as_the_dtensors_saved_and_loads_into_a_fresh_model(store, group):  # noqa: F811
    from torch.distributed.tensor import DTensor

    model, opt = trained(0)
    saved = {"model": model.state_dict(), "opt": opt.state_dict()}
    assert snapshot.save(1, saved, replicated=False)
    fresh, fresh_opt = fsdp_model(1)  # other weights: the load must replace them
    step, back = snapshot.load(replicated=False)
    assert step == 1
    for name, tensor in saved["model"].items():
        got = back["model"][name]
        assert isinstance(got, DTensor) and got.placements == tensor.placements, name
        assert got.device_mesh == tensor.device_mesh and got.shape == tensor.shape and got.stride() == tensor.stride()
        assert torch.equal(got.to_local(), tensor.to_local())
    assert isinstance(back["opt"]["state"][0]["exp_avg"], DTensor)
    assert not isinstance(back["opt"]["state"][0]["step"], DTensor)  # a plain tensor stays one
    fresh.load_state_dict(back["model"])
    fresh_opt.load_state_dict(back["opt"])
    for a, b in zip(fresh.state_dict().values(), saved["model"].values()):
        assert torch.equal(a.to_local(), b.to_local())
    fresh(torch.randn(4, 6)).sum().backward()
    fresh_opt.step()  # a plain tensor in its state fails here: mixed torch.Tensor and DTensor


def test_a_second_load_reuses_the_mesh_it_made(store, group):  # noqa: F811
    model, opt = trained(0)
    snapshot.save(1, {"model": model.state_dict()}, replicated=False)
    first = snapshot.load(replicated=False)[1]["model"]["0.weight"].device_mesh
    assert snapshot.load(replicated=False)[1]["model"]["0.weight"].device_mesh is first


def test_a_sharded_dtensor_in_replicated_state_is_refused_by_its_key_path(store, group):  # noqa: F811
    model, _ = trained(0)
    with pytest.raises(snapshot.SnapshotTypeError, match=r"state\['model'\]\['0.weight'\] is a DTensor sharded "
                                                         r"across ranks \(Shard\(dim=0\)\): save it with replicated=False"):
        snapshot.save(1, {"model": model.state_dict()})
    assert store.shelf.steps("local-0") == []


def test_a_replicated_dtensor_is_replicated_state(store, group):  # noqa: F811
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    weight = DTensor.from_local(torch.arange(6.0).reshape(2, 3), mesh, [Replicate()])
    assert snapshot.save(2, {"w": weight})
    back = snapshot.load()[1]["w"]
    assert back.placements == (Replicate(),) and back.device_mesh == mesh and torch.equal(back.to_local(),
                                                                                         weight.to_local())


def test_a_partial_dtensor_is_refused_at_save(store, group):  # noqa: F811
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial

    partial = DTensor.from_local(torch.ones(2), init_device_mesh("cpu", (1,)), [Partial()])
    with pytest.raises(snapshot.SnapshotTypeError, match=r"state\['p'\] is a DTensor placed Partial\(sum\); a "
                                                         r"snapshot keeps DTensors placed Shard, Replicate or"):
        snapshot.save(1, {"p": partial}, replicated=False)

