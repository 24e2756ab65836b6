"""The trainers' snapshots' parts (snapshots/rank/trainers.py, cadence.py, hf.py,
lightning.py): the bootstrap installs them where SNAPSHOT_ENV is set, whatever the
progress setting, importing no trainer; N is chosen from a save's cost within 5 %; a state
becomes plain values; HF's RNG states come back as HF reads them. Whole restarts of real
trainers: tests/integration/test_trainer_snapshots.py."""

from __future__ import annotations

import collections
import enum
import json
import os
import random
import subprocess
import sys
import types

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.base.knobs import TRAINER_PROGRESS_ENV, read_knobs
from metaflow_extensions.torchrun.plugins.torchrun.launch.command import BOOTSTRAP_MODULE
from metaflow_extensions.torchrun.plugins.torchrun.procs import entry, names, trainer_hooks
from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import trainers as trainer_snapshots
from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank.cadence import (CHECKS, MEASURED, Cadence,
                                                                                 chosen_every, every_from_setting)

from lazy_torch import torch  # noqa: E402  (collection imports no torch: test_pools)
from test_snapshot_rank import store  # noqa: E402,F401 (a fixture)

SEEN = """
import json, sys
import transformers.trainer as t
print(json.dumps({"callbacks": [c.__name__ for c in t.DEFAULT_CALLBACKS],
                  "train": bool(getattr(t.Trainer.train, "_torchrun_snapshots", False))}))
"""
NOTHING = """
import json, sys
print(json.dumps({"loaded": sorted(m for m in ("transformers", "lightning", "torch", "numpy") if m in sys.modules)}))
"""


def _rank(tmp_path, code, snapshots, progress="1"):
    script = tmp_path / "script.py"
    script.write_text(code)
    knobs, _ = read_knobs({TRAINER_PROGRESS_ENV: progress})
    work = tmp_path / "work"
    work.mkdir()
    path = entry.write_entry(str(work), [str(script)], knobs.trainer_progress)
    environ = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", names.SNAPSHOT_ENV)}
    environ.update({names.WORK_DIR_ENV: str(work), "RANK": "0", names.LABELS_ENV: "0", names.ENTRY_ENV: path})
    if snapshots:
        environ[names.SNAPSHOT_ENV] = str(tmp_path / "no-store.sock")  # not reached: nothing is saved
    r = subprocess.run([sys.executable, "-m", BOOTSTRAP_MODULE, path], env=environ, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("snapshots, progress", [(True, "0"), (True, "1"), (False, "1")])
def test_the_bootstrap_adds_the_snapshot_callback_where_snapshots_are_on(tmp_path, snapshots, progress):
    seen = _rank(tmp_path, SEEN, snapshots, progress)
    assert ("TorchrunSnapshots" in seen["callbacks"]) is snapshots, seen
    assert ("TorchrunProgress" in seen["callbacks"]) is (progress == "1"), seen  # the two hooks, apart
    assert seen["train"] is snapshots
    assert seen["callbacks"][0] == "DefaultFlowCallback"


def test_installing_the_snapshots_imports_no_trainer_torch_or_numpy(tmp_path):
    assert _rank(tmp_path, NOTHING, True) == {"loaded": []}


def test_two_hooks_on_one_module_both_run(tmp_path, monkeypatch):
    (tmp_path / "mftr_hooked_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    seen = []
    trainer_hooks.after_import("a", {"mftr_hooked_mod": lambda m: seen.append(("a", m.VALUE))})
    trainer_hooks.after_import("b", {"mftr_hooked_mod": lambda m: seen.append(("b", m.VALUE))})
    trainer_hooks.after_import("a", {"mftr_hooked_mod": lambda m: seen.append(("a again", m.VALUE))})
    try:
        import mftr_hooked_mod  # noqa: F401
    finally:
        sys.modules.pop("mftr_hooked_mod", None)
    assert sorted(seen) == [("a", 1), ("b", 1)]


# -- N ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("saves, steps, every", [
    ([0.010], [0.100], 2),  # 10 ms of 100 ms: 5 % at every 2nd
    ([0.001], [0.100], 1),
    ([0.030], [0.100], 6),
    ([5.0, 0.010], [0.100], 2),  # the first save (it connects) does not count beside others
    ([0.010], [0.100, 0.100, 9.0], 2),  # one slow step (a checkpoint, an eval) does not move it
    ([0.0], [0.100], 1),
    ([], [0.1], 1),
])
def test_n_is_the_smallest_within_five_percent(saves, steps, every):
    assert chosen_every(saves, steps) == every
    save = saves[-1] if saves else 0
    if save:
        assert save / (every * 0.1) <= 0.05 + 1e-12 and (every == 1 or save / ((every - 1) * 0.1) > 0.05)


@pytest.mark.parametrize("text, every", [("", None), ("0", None), (" 7 ", 7), ("1", 1)])
def test_the_setting_gives_n_or_leaves_it_to_be_chosen(text, every):
    assert every_from_setting(text) == every


@pytest.mark.parametrize("text", ["-1", "x", "1e3", "2.5", "9" * 40, "٣"])
def test_a_setting_that_is_no_number_of_steps_is_refused_by_what_it_means(text):
    with pytest.raises(ValueError, match="no number of steps"):
        every_from_setting(text)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _train(cadence, clock, steps, step_s, save_s):
    saved = []
    for step in range(1, steps + 1):
        clock.now += step_s
        if cadence.due(step):
            clock.now += save_s
            cadence.saved(save_s)
            saved.append(step)
        cadence.resume()
    return saved


def test_a_users_n_saves_at_its_multiples_and_asks_the_gang_nothing():
    asked = []
    cadence = Cadence(3, lambda n: asked.append(n) or n, lambda text: None, Clock())
    assert _train(cadence, cadence._clock, 10, 0.1, 0.05) == [3, 6, 9]
    assert asked == []


def test_a_measured_n_saves_first_then_keeps_to_five_percent_taking_the_gangs_largest():
    said, asked = [], []
    clock = Clock()
    cadence = Cadence(None, lambda n: asked.append(n) or max(n, 4), said.append, clock)
    saved = _train(cadence, clock, 40, 0.100, 0.010)  # N = 2 here; another rank wants 4
    assert saved[:MEASURED] == [1, 2] and all(s % 4 == 0 for s in saved[MEASURED:]) and 40 in saved
    assert asked == [2] * len([c for c in CHECKS if c <= 40])
    assert len(said) == 1 and "every 4 steps" in said[0] and "a save costs 10.0 ms, a step 100.0 ms" in said[0]
    saving = 0.010 * len(saved)
    assert saving / (40 * 0.100) <= 0.05 + 0.02 * MEASURED / 40  # the measuring saves aside, within 5 %


def test_a_measured_n_is_said_once_the_first_time_it_is_chosen():
    """Chosen again at later checks (here it changes), said at the first only: an HF run said it 5 times."""
    said = []
    clock = Clock()
    cadence = Cadence(None, lambda n: n, said.append, clock)
    _train(cadence, clock, 12, 0.100, 0.010)
    step_s = [0.100]
    for step in range(13, 40):
        clock.now += step_s[0]
        if cadence.due(step):
            clock.now += 0.050
            cadence.saved(0.050)  # saves grew 5x: N goes up, from the mean of the saves but the first
        cadence.resume()
    assert [s.split(":")[0] for s in said] == ["a snapshot every 2 steps"] and cadence.every == 6, said


def test_the_interval_is_said_once_a_process_and_not_by_a_restarts_ranks(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    trainer_snapshots._said.discard("cadence")
    trainer_snapshots.say_cadence("a snapshot every 2 steps")
    trainer_snapshots.say_cadence("a snapshot every 2 steps")  # a second train() in the same script
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    trainer_snapshots._said.discard("cadence")
    trainer_snapshots.say_cadence("a snapshot every 3 steps")  # the restart's ranks chose again
    assert capsys.readouterr().err.count("a snapshot every") == 1


# -- plain values -------------------------------------------------------------------------------

class Colour(str, enum.Enum):
    RED = "red"


def test_a_state_becomes_plain_values_and_what_cannot_be_is_named():
    import numpy

    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank.trainers import Dropped, plain

    point = collections.namedtuple("point", "x y")
    t = torch.ones(2)
    dropped = Dropped()
    out = plain(collections.OrderedDict(a=t, b=point(1, 2.5), c=[numpy.int64(3), lambda: 0, numpy.arange(2)],
                                        d=Colour.RED, e={(1, 2): 1, True: 2, 3: None}, f=types.SimpleNamespace()),
                "s", dropped)
    assert type(out) is dict and out["a"] is t
    assert out["b"] == (1, 2.5) and type(out["b"]) is tuple
    assert out["c"] == [3, None, [0, 1]] and type(out["c"][0]) is int
    assert out["d"] == "red" and type(out["d"]) is str
    assert out["e"] == {3: None} and "f" not in out
    assert len(dropped) == 4 and "s['c'][1] (a function)" in dropped and "s['f'] (a SimpleNamespace)" in dropped


def test_text_of_any_length_rides_in_a_tensor():
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank.trainers import tensor_text, text_tensor

    for text in ("", "é✓ state", json.dumps({"log": ["x" * 1000] * 3000})):
        assert tensor_text(text_tensor(text)) == text


def test_owned_tensors_leave_the_buffer_they_viewed():
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank.trainers import owned

    whole = torch.arange(100, dtype=torch.uint8)
    tree = {"a": [whole[10:20]], "b": (whole[50:60].view(torch.int16),), "c": 1}
    out = owned(tree)
    for t in (out["a"][0], out["b"][0]):
        assert t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    assert torch.equal(out["a"][0], tree["a"][0]) and type(out["b"]) is tuple and out["c"] == 1


# -- HF -----------------------------------------------------------------------------------------

def test_rng_states_come_back_as_hf_reads_them_and_as_lightnings_resume_sets_them():
    numpy = pytest.importorskip("numpy")
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank.trainers import (owned, plain, rng_state,
                                                                                       rng_values, set_rng)

    held = owned(plain(rng_state(False)))  # as a snapshot holds it: plain values and tensors
    first = (random.random(), numpy.random.rand(), torch.rand(1).item())
    state = rng_values(held)
    random.setstate(state["python"])
    numpy.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["cpu"])
    assert (random.random(), numpy.random.rand(), torch.rand(1).item()) == first
    assert state["numpy"][1].dtype == numpy.uint32 and type(state["python"][1]) is tuple
    set_rng(held)
    assert (random.random(), numpy.random.rand(), torch.rand(1).item()) == first


def test_a_snapshot_of_another_model_or_layout_is_not_used():
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank.hf import FORMAT, unfit

    model = torch.nn.Linear(3, 2)
    held = {"format": FORMAT, "model": {k: v.clone() for k, v in model.state_dict().items()}}
    assert unfit(held, model) is None
    assert "named otherwise" in unfit(dict(held, model={"weight": held["model"]["weight"]}), model)
    assert "(2, 3)" in unfit(dict(held, model=dict(held["model"], weight=torch.zeros(3, 3))), model)
    assert "version" in unfit(dict(held, format="other"), model)
    assert "version" in unfit([1], model)


FSDP_BY_ACCELERATE = """
import json, sys
from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import api, trainers
trainers.install()
import torch
from transformers import Trainer, TrainingArguments


def events(trainer):
    # HF's training loop as its callbacks see it: an optimizer and a scheduler, the train's begin, 3 steps.
    # (On CPU accelerate never makes FSDP, and HF's own loop with the flag set reaches for its FSDP plugin.)
    trainer.create_optimizer_and_scheduler(num_training_steps=3)
    handler = trainer.callback_handler
    handler.optimizer, handler.lr_scheduler = trainer.optimizer, trainer.lr_scheduler
    handler.on_train_begin(trainer.args, trainer.state, trainer.control)
    for step in (1, 2, 3):
        trainer.state.global_step = step
        handler.on_step_end(trainer.args, trainer.state, trainer.control)


def train(fsdp):
    args = TrainingArguments(output_dir=sys.argv[1], max_steps=3, use_cpu=True, report_to=[])
    trainer = Trainer(model=torch.nn.Linear(4, 1), args=args)
    assert not args.fsdp and not trainer.is_fsdp_enabled
    trainer.is_fsdp_enabled = fsdp  # as accelerate sets it on GPUs under ACCELERATE_USE_FSDP=true
    trainer._inner_training_loop = lambda *a, **k: events(trainer)
    trainer.train()
    held = api.load()
    return held[0] if held else None


print(json.dumps({"fsdp": train(True), "plain": train(False)}))
"""


def test_an_hf_trainer_that_accelerate_made_fsdp_keeps_no_snapshots(tmp_path, store):  # noqa: F811
    """FSDP turned on by accelerate's config leaves ``TrainingArguments.fsdp`` empty: the trainer's own flag
    is what the callback goes by (it saved every N steps, and the restart never used them). A real HF
    Trainer, its train() and its callbacks, HF's loop replaced by its callback events; the same process's
    plain trainer after it saves, so the store is seen to take what is given."""
    script = tmp_path / "fsdp_by_accelerate.py"
    script.write_text(FSDP_BY_ACCELERATE)
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("ACCELERATE_") and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    environ.update(store.environ(), **{names.SNAPSHOT_EVERY_ENV: "1"})
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "out")], env=environ, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"fsdp": None, "plain": 3}, r.stderr[-3000:]
    said = "HF Trainer with FSDP: no trainer snapshots (its state is sharded across ranks)"
    assert r.stderr.count(said) == 1, r.stderr[-3000:]
