"""HF's Trainer (and Lightning's) resumes from an in-memory snapshot with no change to its script: the callback
the ranks' import hook adds (snapshots/rank/trainers.py) saves every N steps, and a restarted
train() goes through HF's own resume path from it. Real torchrun, 2 gloo ranks on CPU, a
one-layer BERT built from code (dropout on, so a lost RNG shows in the weights).

The last test is a real flow, @torchrun(restarts=1) on 2 nodes x 2 processes. The others play the task: it runs the node's snapshot store in-process and starts torchrun
itself, through a shim that installs the hook as the bootstrap does where SNAPSHOT_ENV is set.
Rank 1 SIGKILLs itself at a step's end on the first start; torchrun is started again against
the same store. The final weights must equal, bit for bit, an uninterrupted plain torchrun's, with
no store and no hook (one run, for the whole pytest run); the flow's, its own uninterrupted flow's.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from .calls import once_per_pytest_run
from .helpers import output
from metaflow_extensions.torchrun.plugins.torchrun.snapshots.node.store import SnapshotStore
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import RESTART_ENV, SNAPSHOT_ENV, SNAPSHOT_EVERY_ENV

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(REPO, "tests", "flows", "scripts")
SHIM = """import os, runpy, sys
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import RESTART_COUNT_ENV, RESTART_ENV
from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import trainers as trainer_snapshots
if os.environ.get(RESTART_ENV):  # as the bootstrap does: the gang's restart k runs a fresh torchrun
    os.environ[RESTART_COUNT_ENV] = os.environ[RESTART_ENV]
trainer_snapshots.install()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
STEPS, KILL_AT = 30, 20


def torchrun(tmp_path, out, store, script, *args, every="", restart=0):
    """One torchrun of 2 ranks; its whole process group is killed if it outlives the timeout. ``store``
    None: plain torchrun, nothing of ours (no store, no hook). Its temporary directory is its own."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=REPO, MFTR_TEST_OUT=str(out), OMP_NUM_THREADS="1", TMPDIR=str(tmp))
    env.pop(SNAPSHOT_ENV, None)
    entry = [os.path.join(SCRIPTS, script)]
    if store is not None:
        shim = tmp_path / "shim.py"
        shim.write_text(SHIM)
        env.update(store.environ(), **{SNAPSHOT_EVERY_ENV: every, RESTART_ENV: str(restart)})
        entry.insert(0, str(shim))
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--tee", "3",
            *entry, *args]  # --tee: each line says its rank, [default<R>]:
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, text


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The weights every HF run here must end with, snapshots taken or a rank killed: one plain run
    of STEPS steps for the whole pytest run (each rank's import of transformers costs seconds)."""
    def produce():
        out = tmp_path_factory.mktemp("hf-uninterrupted")
        code, text = torchrun(out, out, None, "hf_snapshot.py", "--steps", str(STEPS))
        assert code == 0, text[-4000:]
        return {"weights": (out / "weights.sha256").read_text()}

    return once_per_pytest_run(tmp_path_factory, "hf-uninterrupted", produce)["weights"]


def starts(out, rank, field="first_step"):
    return [json.loads(line)[field] for line in (out / ("starts-rank-%d.jsonl" % rank)).read_text().splitlines()]


def held_after_resume(out):
    """Each rank at the restart's first step holds no copy of the snapshot it resumed from (no more CPU tensor
    bytes than at the first start's first step, short of its model's size: the copy is 3 times that, with
    Adam's state) and no checkpoint directory written from it. Its resident memory, for the record."""
    for rank in (0, 1):
        first, second = [json.loads(line) for line in (out / ("starts-rank-%d.jsonl" % rank)).read_text().splitlines()]
        print("rank %d: resident %.1f MB before train(), %.1f MB at its first step (first start: %.1f, %.1f); CPU "
              "tensors %d bytes (first start %d, model %d)" % (rank, second["rss_before"] / 2**20, second["rss"] / 2**20,
                                                              first["rss_before"] / 2**20, first["rss"] / 2**20,
                                                              second["tensor_bytes"], first["tensor_bytes"],
                                                              first["model_bytes"]))
        assert second["resume_dirs"] == [], second
        assert second["tensor_bytes"] < first["tensor_bytes"] + first["model_bytes"], (first, second)


def snapshot_lines(text):
    return [line for line in text.splitlines() if "metaflow-torchrun: snapshot:" in line]


def test_an_hf_trainer_resumes_at_its_last_snapshot_with_the_same_weights(tmp_path, uninterrupted):
    killed = tmp_path / "killed"
    killed.mkdir()
    args = ("--steps", str(STEPS), "--kill-at", str(KILL_AT))
    with SnapshotStore(str(tmp_path / "store"), budget=256 << 20) as store:
        code, first = torchrun(tmp_path, killed, store, "hf_snapshot.py", *args, every="3")
        assert code != 0 and (killed / "killed").exists(), first[-4000:]
        code, second = torchrun(tmp_path, killed, store, "hf_snapshot.py", *args, every="3", restart=1)
        assert code == 0, second[-4000:]
    # Every 3 steps: the kill at step 20's end finds 18 the newest snapshot both ranks hold.
    resumed = KILL_AT - KILL_AT % 3
    for rank in (0, 1):
        assert starts(killed, rank) == [1, resumed + 1], (starts(killed, rank), snapshot_lines(second))
    held_after_resume(killed)
    lines = snapshot_lines(second)
    assert any("resumed at step %d from memory" % resumed in line for line in lines), lines
    assert any("HF Trainer resumes at step %d" % resumed in line for line in lines), lines
    assert (killed / "weights.sha256").read_text() == uninterrupted, lines


def test_an_hf_trainers_snapshot_interval_is_chosen_from_a_saves_cost(tmp_path, uninterrupted):
    """No setting: N from the measured save and step, said on rank 0; the weights as without a store."""
    out = tmp_path / "measured"
    out.mkdir()
    with SnapshotStore(str(tmp_path / "store"), budget=256 << 20) as store:
        code, text = torchrun(tmp_path, out, store, "hf_snapshot.py", "--steps", str(STEPS))
        assert code == 0, text[-4000:]
    chosen = [line for line in snapshot_lines(text) if "a snapshot every" in line]
    assert chosen and all(line.startswith("[default0]:") for line in chosen), snapshot_lines(text)
    assert "a save costs" in chosen[0] and "a step" in chosen[0], chosen
    assert (out / "weights.sha256").read_text() == uninterrupted


def test_a_lightning_trainer_resumes_at_its_last_snapshot_with_its_weights_of_then(tmp_path):
    """Every 3 steps; the restart's weights at its start are the first start's at step 18, bit for bit, and
    its RNGs at its first step the first start's at step 19 (Lightning's checkpoint keeps none: the
    snapshot does). No snapshot ran the user's on_save_checkpoint hooks (the script takes no checkpoint)."""
    out = tmp_path / "killed"
    out.mkdir()
    args = ("--steps", str(STEPS), "--kill-at", str(KILL_AT))
    with SnapshotStore(str(tmp_path / "store"), budget=256 << 20) as store:
        code, first = torchrun(tmp_path, out, store, "lightning_snapshot.py", *args, every="3")
        assert code != 0 and (out / "killed").exists(), first[-4000:]
        code, second = torchrun(tmp_path, out, store, "lightning_snapshot.py", *args, every="3", restart=1)
        assert code == 0, second[-4000:]
    resumed = KILL_AT - KILL_AT % 3
    lines = snapshot_lines(second)
    assert any("Lightning resumes at step %d" % resumed in line for line in lines), lines
    for rank in (0, 1):
        notes = [json.loads(line) for line in (out / ("rank-%d.jsonl" % rank)).read_text().splitlines()]
        begins = [n for n in notes if "start" in n]
        assert [n["start"] for n in begins] == [0, resumed], begins
        then = [n["digest"] for n in notes[:notes.index(begins[1])] if n.get("step") == resumed]
        assert then == [begins[1]["digest"]], (then, begins)
        rng = [n["rng"] for n in notes if n.get("step") == resumed + 1]
        assert len(rng) == 2 and rng[0] == rng[1], rng
        assert not [n for n in notes if "hook" in n], notes
    assert json.loads((out / "final.json").read_text())["global_step"] == STEPS


def _flow(gang, *args):
    gang.env["MFTR_TORCHRUN_ATTRS"] = json.dumps({"restarts": 1})
    args = ["--steps", str(STEPS), "--pause", "0.02", *args]
    proc = gang.run("--script", "hf_snapshot.py", "--nproc", "2", "--script-args", json.dumps(args), timeout=500)
    text = output(proc)
    assert proc.returncode == 0, text[-4000:]
    return text, pathlib.Path(gang.out)


def test_an_hf_trainer_in_a_flow_resumes_from_memory_after_a_rank_kill(gang):
    """@torchrun(restarts=1) at 2 x 2, rank 1 (node 0) killed, N chosen from the cost: at most 10 steps
    lost (a step is made slow enough, by its data, that N stays under 10 on a loaded machine), weights
    as without a failure (a flow's: 2 nodes x 2 processes end on other weights than 1 x 2). The
    restart's ranks did not import transformers themselves: it was in memory as each one's script
    began (each node's warm process learned it from its ranks' first step, procs/warm_imports.py),
    where the first start's ranks imported it."""
    _, out = _flow(gang)
    whole = (out / "weights.sha256").read_text()
    for path in [*out.glob("starts-rank-*.jsonl"), out / "weights.sha256"]:
        path.unlink()
    text, out = _flow(gang, "--kill-at", str(KILL_AT))
    first, second = starts(out, 1)
    resumed = second - 1
    assert first == 1 and KILL_AT - 10 <= resumed <= KILL_AT and starts(out, 0)[-1] == second, text[-4000:]
    assert "resumed at step %d from memory" % resumed in text, text[-4000:]
    assert "HF Trainer resumes at step %d" % resumed in text, text[-4000:]
    # The interval chosen, said once a run: not at each check, not again by the restart's ranks.
    assert text.count("a snapshot every") == 1, [line for line in text.splitlines() if "a snapshot every" in line]
    assert (out / "weights.sha256").read_text() == whole
    assert {rank: starts(out, rank, "warm") for rank in range(4)} == dict.fromkeys(range(4), [False, True])
