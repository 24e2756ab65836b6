"""A rank's save and load against a real store in this process (one rank, no gang)."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank.wire import key_for

from metaflow_extensions.torchrun.plugins.torchrun.snapshots.node.store import SnapshotStore
from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import api as snapshot
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import (OFF_BY_SETTING, OFF_NO_RESTARTS, OFF_ON_NODE,
                                                                      SNAPSHOT_ENV, SNAPSHOTS_OFF_ENV)
from lazy_torch import torch


@pytest.fixture
def store(tmp_path, monkeypatch):
    s = SnapshotStore(str(tmp_path / "snapshots"), budget=64 << 20)
    monkeypatch.setenv(SNAPSHOT_ENV, s.path)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
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


def test_load_returns_the_newest_saved_state_bit_for_bit(store, capsys, monkeypatch):
    assert snapshot.load() is None  # a first start: nothing to find, nothing said
    assert "no snapshot" not in capsys.readouterr().err
    for step in range(4):
        state = model_state(step)
        assert snapshot.save(step, state) is True
        assert store.shelf.steps("local-0")[-1] == step  # held when save returns: no thread, nothing to wait for
    assert snapshot.flush(30)
    step, back = snapshot.load()  # mid-run on a first start: the newest step, and no claim of a resume
    assert step == 3 and "resumed" not in capsys.readouterr().err
    assert store.last_load()[:3] == (3, None, 3)
    for name, tensor in state["model"].items():
        assert torch.equal(back["model"][name], tensor)
    assert torch.equal(back["opt"]["state"][0]["momentum_buffer"], state["opt"]["state"][0]["momentum_buffer"])
    assert torch.equal(back["rng"], state["rng"]) and back["opt"]["param_groups"] == state["opt"]["param_groups"]
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # a restart's first load is a resume, said once
    assert snapshot.load()[0] == 3 and snapshot.load()[0] == 3
    assert capsys.readouterr().err.count("resumed at step 3 from memory (this node's copy), 0 steps lost") == 1


def test_a_restart_that_finds_no_snapshot_says_once_that_it_falls_back(store, capsys, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert snapshot.load() is None and snapshot.load() is None
    said = capsys.readouterr().err
    assert said.count("no snapshot in memory that every rank holds: resuming from your checkpoint") == 1, said


def test_later_changes_to_the_state_do_not_reach_the_snapshot(store):
    weights = torch.zeros(1 << 20)
    assert snapshot.save(1, {"w": weights})
    weights += 1  # the training goes on at once: the snapshot is the copy taken at save
    assert snapshot.flush(30)
    _, back = snapshot.load()
    assert float(back["w"].sum()) == 0.0


def test_many_saves_in_a_row_end_with_the_last_one_held_in_three_slots(store):
    peak = 0
    for step in range(50):
        assert snapshot.save(step, {"w": torch.full((1 << 16,), float(step))})
        peak = max(peak, store.shelf.used())
    step, back = snapshot.load()
    assert step == 49 and float(back["w"][0]) == 49.0
    saver = snapshot._savers[(store.path, "local-0")]
    assert peak <= store.budget and len(saver._maps) == 3 and len(store.shelf._slots()) == 3


def test_sharded_state_is_kept_per_rank_and_loaded_as_saved(store, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    snapshot.save(5, {"shard": torch.arange(4)}, replicated=False)
    snapshot.flush(30)
    assert store.shelf.steps("rank-3-of-1") == [5] and store.shelf.steps("local-0") == []
    assert snapshot.load() is None  # replicated state: none saved
    step, back = snapshot.load(replicated=False)
    assert step == 5 and back["shard"].tolist() == [0, 1, 2, 3]
    # The gang smaller or larger since (a node lost): a shard of another world size is not this rank's.
    assert store.shelf.steps(key_for(False, 3, 0, 2)) == [] and key_for(True, 3, 1, 2) == key_for(True, 5, 1, 8)


def test_a_snapshot_changed_out_of_bounds_after_its_commit_is_not_loaded_the_previous_one_is(store, capsys):
    for step in (1, 2):
        snapshot.save(step, {"w": torch.full((100,), float(step))})
    slot = store.shelf.pin("local-0", 2)
    slot.map[30:34] = b"\xff\xff\xff\xff"  # its manifest: checked again at every load
    store.shelf.unpin(slot)
    step, back = snapshot.load()
    assert step == 1 and float(back["w"][0]) == 1.0
    assert "the snapshot of step 2 is not used: the manifest is not JSON" in capsys.readouterr().err


def test_the_steps_lost_are_those_saved_after_the_step_resumed(store, capsys, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    for step in range(1, 4):
        snapshot.save(step, {"w": torch.ones(3)})
    for step in range(1, 6):
        snapshot.save(step, {"shard": torch.ones(3)}, replicated=False)
    assert snapshot.load()[0] == 3
    assert "resumed at step 3 from memory (this node's copy), 2 steps lost" in capsys.readouterr().err
    assert store.last_load()[:3] == (3, None, 5) and store.newest() == 5


KILLED_MID_COPY = textwrap.dedent("""
    import sys, time, torch
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import api as snapshot
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import saver as snapshot_saver
    assert snapshot.save(1, {"w": torch.full((1 << 20,), 1.0)})
    def half(target, plan, start):  # the copy under way when the rank is killed
        target[start:start + (1 << 21)].fill_(0x7F)
        print("copying", flush=True)
        time.sleep(600)
    snapshot_saver.copy_in = half
    snapshot.save(2, {"w": torch.full((1 << 20,), 2.0)})
""")


def test_a_rank_killed_mid_copy_leaves_the_previous_snapshot_to_load(store):
    proc = subprocess.Popen([sys.executable, "-c", KILLED_MID_COPY], stdout=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        assert proc.stdout.readline() == b"copying\n"
        assert store.shelf.arriving() == 1 and store.shelf.steps("local-0") == [1]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    step, back = snapshot.load()
    assert step == 1 and torch.equal(back["w"], torch.full((1 << 20,), 1.0))
    assert snapshot.save(2, {"w": torch.full((1 << 20,), 2.0)}) and snapshot.load()[0] == 2


def test_a_snapshot_over_the_budget_is_refused_at_the_first_save_naming_both_sizes(tmp_path, monkeypatch, capsys):
    with SnapshotStore(str(tmp_path / "small"), budget=1 << 20) as small:
        monkeypatch.setenv(SNAPSHOT_ENV, small.path)
        big = {"w": torch.zeros(1 << 18)}  # 1 MB of float32
        assert snapshot.save(0, big) is False
        assert snapshot.save(1, big) is False
        err = capsys.readouterr().err
        assert err.count("snapshots are off: ") == 1
        assert "a snapshot of 1.0 MB on this node's rank needs" in err and "budget is 1.0 MB" in err
        assert small.shelf.used() == 0


def test_a_nodes_ranks_are_refused_together_and_it_is_said_once(tmp_path):
    """4 local ranks, a budget that holds 2 of them: none saves (a step every rank holds is what a restart
    resumes from; 2 saving kept memory no restart could use), said once by the rank whose plan decided it."""
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.node.shelf import SLOTS_PER_KEY
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import memory
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank.saver import Saver

    state = {"w": torch.zeros(1 << 18)}  # 1 MB of float32
    said = []
    with SnapshotStore(str(tmp_path / "node"), budget=2 * SLOTS_PER_KEY * memory.room(1 << 21)) as node:
        savers = [Saver(node.path, "local-%d" % r, lambda text, r=r: said.append((r, text)), 4) for r in range(4)]
        assert [saver.take(0, state) for saver in savers] == [False] * 4
        assert node.shelf.used() == 0 and all(saver.off for saver in savers)
    assert len(said) == 1 and said[0][0] == 0 and "each of this node's 4 local ranks" in said[0][1], said


def test_a_cuda_ranks_pinned_buffers_are_planned_with_its_slots(tmp_path):
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.node.shelf import SLOTS_PER_KEY
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import memory
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank.saver import Saver, pinned_bytes

    total = 1 << 20
    assert pinned_bytes(total) == int(2.25 * total)  # the two buffers the copy thread keeps
    with SnapshotStore(str(tmp_path / "node"), budget=SLOTS_PER_KEY * memory.room(total) + total) as node:
        assert Saver(node.path, "rank-0-of-2", print)._fits(total, cuda=False)
        cuda = Saver(node.path, "rank-1-of-2", print)
        assert not cuda._fits(total, cuda=True) and "two pinned buffers" in (cuda.off or "")


def test_what_cannot_be_stored_is_named_at_save(store):
    with pytest.raises(snapshot.SnapshotTypeError, match=r"state\['opt'\]\['fn'\] is a builtins.function"):
        snapshot.save(0, {"opt": {"fn": lambda: 0}})


def test_outside_torchrun_save_keeps_nothing_and_load_returns_none_said_once(monkeypatch, capsys):
    monkeypatch.delenv(SNAPSHOT_ENV, raising=False)
    monkeypatch.delenv(SNAPSHOTS_OFF_ENV, raising=False)
    snapshot._said.clear()
    assert snapshot.save(0, {"w": torch.ones(2)}) is False
    assert snapshot.load() is None and snapshot.save(1, {"w": torch.ones(2)}) is False
    err = capsys.readouterr().err
    assert err.count("no @torchrun snapshot store here") == 1 and SNAPSHOT_ENV not in err
    with pytest.raises(snapshot.SnapshotTypeError):
        snapshot.save(2, {"bad": object()})  # named here too, not first at a restart under @torchrun


@pytest.mark.parametrize("why, said", [
    (OFF_BY_SETTING, "snapshots are off for this step (`@torchrun(snapshots=False)`)"),
    (OFF_NO_RESTARTS, "snapshots are off for this step: they serve an in-step restart, and it allows none"),
])
def test_under_torchrun_with_snapshots_off_rank_0_of_the_first_start_says_why_once(monkeypatch, capsys, why, said):
    """The runtime's reason in words, never the variable's name; once a run, not once a rank or a start."""
    monkeypatch.delenv(SNAPSHOT_ENV, raising=False)
    monkeypatch.setenv(SNAPSHOTS_OFF_ENV, why)
    for rank, restart, says in (("0", "0", 1), ("1", "0", 0), ("0", "1", 0)):
        snapshot._said.clear()
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", restart)
        assert snapshot.save(0, {"w": torch.ones(2)}) is False and snapshot.load() is None
        err = capsys.readouterr().err
        assert err.count(said) == says and SNAPSHOT_ENV not in err, (rank, restart, err)
    monkeypatch.setenv(SNAPSHOTS_OFF_ENV, OFF_ON_NODE)  # one node's store: each node's local rank 0 says it
    monkeypatch.setenv("LOCAL_RANK", "0")
    snapshot._said.clear()
    assert snapshot.load() is None and "snapshots are off on this node" in capsys.readouterr().err


def test_a_store_gone_costs_the_training_nothing(store, capsys):
    assert snapshot.save(0, {"w": torch.ones(10)})
    store.close()
    assert snapshot.save(1, {"w": torch.ones(10)}) is False  # not kept: said once, the training goes on
    assert snapshot.save(2, {"w": torch.ones(10)}) is False
    assert snapshot.flush(30)
    assert capsys.readouterr().err.count("was not kept") == 1
    assert snapshot.load() is None


def test_without_sealed_memfds_save_says_why_once_and_keeps_nothing(tmp_path, monkeypatch, capsys):
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import memory as snapshot_memory

    monkeypatch.setattr(snapshot_memory, "unavailable", lambda: "no sealed memfd here: snapshots are off")
    with SnapshotStore(str(tmp_path / "nomemfd"), budget=1 << 20) as s:
        monkeypatch.setenv(SNAPSHOT_ENV, s.path)
        assert snapshot.save(0, {"w": torch.ones(4)}) is False and snapshot.save(1, {"w": torch.ones(4)}) is False
        err = capsys.readouterr().err
        assert err.count("snapshots are off: no sealed memfd here") == 1


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


def test_the_copy_threads_path_commits_the_newest_and_flush_waits_for_it(store, monkeypatch):
    """CUDA state's path (pinned buffer, event, thread), run on CPU: no GPU here to run it for real."""
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import codec
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import saver as snapshot_saver

    real = snapshot_saver.HostBuffer
    monkeypatch.setattr(snapshot_saver, "HostBuffer", lambda size, pinned: real(size, pinned=False))
    saver = snapshot_saver.Saver(store.path, "rank-0-of-1", print)
    for step in range(20):
        state = {"w": torch.full((1 << 18,), float(step))}
        plan = codec.plan(state)
        manifest = codec.manifest_bytes(step, plan.tree, plan.specs)
        start, total = codec.layout(manifest, plan.data_bytes)
        assert saver._fits(total, cuda=True) and saver._queue(step, plan, manifest, start, total)
        assert len(saver._buffers) <= 2
    assert saver.flush(30) and saver.stored_step == 19 and store.shelf.steps("rank-0-of-1")[-1] == 19
    step, back = snapshot.load(replicated=False)
    assert step == 19 and float(back["w"][-1]) == 19.0


TWO_RANKS_LOAD = textwrap.dedent("""
    import json, os, sys, torch, torch.distributed as dist
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import api as snapshot
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=int(os.environ["RANK"]), world_size=2)
    step, state = snapshot.load()
    print(json.dumps([step, int(state["start"])]), flush=True)
    dist.destroy_process_group()
""")


def test_two_ranks_resume_from_one_start_never_a_step_two_starts_left(store, tmp_path, monkeypatch):
    """Both ranks saved steps 4 and 5 in start 0; start 1 resumed at 4, local rank 0 saved step 5 again (its
    start 0's 5 replaced) and local rank 1 died in its save of 5 (start 0's kept). Each holds a step 5, of two
    starts: two real gloo ranks load the step 4 they share (start 0's), not each its own step 5 (DDP replicas
    off in their last bits, then drifting apart)."""
    def saves(local_rank, start, steps):
        snapshot._savers.clear()
        monkeypatch.setenv("LOCAL_RANK", str(local_rank))
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(start))
        for step in steps:
            assert snapshot.save(step, {"start": torch.tensor(start), "w": torch.full((8,), float(step))})

    saves(0, 0, (4, 5))
    saves(1, 0, (4, 5))
    saves(0, 1, (5,))
    snapshot._savers.clear()
    assert store.shelf.held("local-0") == [(0, 4), (1, 5)] and store.shelf.held("local-1") == [(0, 4), (0, 5)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), TORCHELASTIC_RESTART_COUNT="2", WORLD_SIZE="2")
    procs = [subprocess.Popen([sys.executable, "-c", TWO_RANKS_LOAD, str(tmp_path / "rdzv")], stdout=subprocess.PIPE,
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in (0, 1)]
    try:
        out = [p.communicate(timeout=120)[0].decode() for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0, 0] and out == ["[4, 0]\n", "[4, 0]\n"], out
