"""A rank's save and load against a real store in this process (one rank, no gang)."""

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.gang.snapshot_store import SnapshotStore
from metaflow_extensions.torchrun.plugins.torchrun.procs import snapshot
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import SNAPSHOT_ENV
from lazy_torch import torch


@pytest.fixture
def store(tmp_path, monkeypatch):
    s = SnapshotStore(str(tmp_path / "snapshots"), budget=64 << 20)
    monkeypatch.setenv(SNAPSHOT_ENV, s.path)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    snapshot._said.clear()
    yield s
    s.close()


def model_state(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(64, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "opt": opt.state_dict(), "rng": torch.get_rng_state()}


def test_load_returns_the_newest_saved_state_bit_for_bit(store):
    assert snapshot.load() is None  # a first start
    for step in range(4):
        state = model_state(step)
        assert snapshot.save(step, state) is True
    assert snapshot.flush(30)
    step, back = snapshot.load()
    assert step == 3
    for name, tensor in state["model"].items():
        assert torch.equal(back["model"][name], tensor)
    assert torch.equal(back["opt"]["state"][0]["momentum_buffer"], state["opt"]["state"][0]["momentum_buffer"])
    assert torch.equal(back["rng"], state["rng"]) and back["opt"]["param_groups"] == state["opt"]["param_groups"]


def test_save_returns_before_the_store_has_it_and_later_changes_do_not_reach_it(store):
    weights = torch.zeros(1 << 20)
    assert snapshot.save(1, {"w": weights})
    weights += 1  # the training goes on at once: the snapshot is the copy taken at save
    assert snapshot.flush(30)
    _, back = snapshot.load()
    assert float(back["w"].sum()) == 0.0


def test_many_saves_in_a_row_end_with_the_last_one_held(store):
    for step in range(40):
        snapshot.save(step, {"w": torch.full((1 << 16,), float(step))})
    assert snapshot.flush(60)
    step, back = snapshot.load()
    assert step == 39 and float(back["w"][0]) == 39.0
    assert store.shelf.used() <= store.budget


def test_sharded_state_is_kept_per_rank_and_loaded_as_saved(store, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    snapshot.save(5, {"shard": torch.arange(4)}, replicated=False)
    snapshot.flush(30)
    assert store.shelf.steps("rank-3") == [5] and store.shelf.steps("local-0") == []
    assert snapshot.load() is None  # replicated state: none saved
    step, back = snapshot.load(replicated=False)
    assert step == 5 and back["shard"].tolist() == [0, 1, 2, 3]


def test_a_changed_snapshot_is_not_loaded_the_previous_one_is(store, capsys):
    for step in (1, 2):
        snapshot.save(step, {"w": torch.full((100,), float(step))})
        snapshot.flush(30)
    store.shelf.get("local-0", 2).blob[200] ^= 0xFF
    step, back = snapshot.load()
    assert step == 1 and float(back["w"][0]) == 1.0
    assert "the snapshot of step 2 is not used: the digest does not match" in capsys.readouterr().err


def test_a_snapshot_over_the_budget_is_refused_at_the_first_save_naming_both_sizes(tmp_path, monkeypatch, capsys):
    with SnapshotStore(str(tmp_path / "small"), budget=1 << 20) as small:
        monkeypatch.setenv(SNAPSHOT_ENV, small.path)
        big = {"w": torch.zeros(1 << 18)}  # 1 MB of float32
        assert snapshot.save(0, big) is False
        assert snapshot.save(1, big) is False
        err = capsys.readouterr().err
        assert err.count("snapshots are off for this rank") == 1
        assert "a snapshot of 1.0 MB needs" in err and "budget is 1.0 MB" in err
        assert small.shelf.used() == 0


def test_what_cannot_be_stored_is_named_at_save(store):
    with pytest.raises(snapshot.SnapshotTypeError, match=r"state\['opt'\]\['fn'\] is a builtins.function"):
        snapshot.save(0, {"opt": {"fn": lambda: 0}})


def test_outside_torchrun_save_keeps_nothing_and_load_returns_none_said_once(monkeypatch, capsys):
    monkeypatch.delenv(SNAPSHOT_ENV, raising=False)
    snapshot._said.clear()
    assert snapshot.save(0, {"w": torch.ones(2)}) is False
    assert snapshot.load() is None and snapshot.save(1, {"w": torch.ones(2)}) is False
    err = capsys.readouterr().err
    assert err.count("no @torchrun snapshot store here") == 1
    with pytest.raises(snapshot.SnapshotTypeError):
        snapshot.save(2, {"bad": object()})  # named here too, not first at a restart under @torchrun


def test_a_store_gone_costs_the_training_nothing(store, capsys):
    assert snapshot.save(0, {"w": torch.ones(10)})
    snapshot.flush(30)
    store.close()
    assert snapshot.save(1, {"w": torch.ones(10)}) is True  # taken; the thread finds the store gone
    assert snapshot.flush(30)
    assert "was not kept" in capsys.readouterr().err
    assert snapshot.load() is None


def test_device_tensors_are_copied_before_the_trainings_next_kernels(store):
    if not torch.cuda.is_available():
        pytest.skip("no GPU here")
    weights = torch.randn(1 << 22, device="cuda")
    half = torch.randn(1000, device="cuda").to(torch.bfloat16)
    expected = weights.cpu()
    for step in range(3):
        assert snapshot.save(step, {"w": weights, "h": half, "t": weights[::3]})
        weights.mul_(2)  # queued after the copy on the same stream: the snapshot holds the value before
        expected_then, expected = expected, weights.cpu()
    assert snapshot.flush(30)
    step, back = snapshot.load()
    assert step == 2 and torch.equal(back["w"], expected_then) and torch.equal(back["h"], half.cpu())
    assert torch.equal(back["t"], expected_then[::3]) and back["w"].device.type == "cpu"
