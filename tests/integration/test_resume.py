"""The checkpoint/resume pattern of Outerbounds' cifar_distributed example,
small and on CPU (tests/flows/checkpoint_flow.py): @retry @checkpoint
@torchrun, 2 nodes x 2 processes, metaflow-checkpoint's Checkpoint saved from
inside rank 0 every epoch. A node's task SIGKILLed after epoch 2 of attempt 0;
attempt 1 resumes from epoch 2. And retry_on="infrastructure": a bug in the
user's code is not retried, a killed node still is."""

import json
import os

import pytest

from .helpers import output, sandbox

FLOW = "checkpoint_flow.py"


@pytest.fixture
def gang(tmp_path):
    """The package's own gang fixture (conftest.py), its runs with metaflow-checkpoint (extras.py)."""
    yield from sandbox(tmp_path, checkpoint=True)


def _events(gang):
    with open(os.path.join(gang.out, "epochs.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _loaded(gang, node, attempt):
    with open(os.path.join(gang.out, "loaded-%d-%d.json" % (node, attempt))) as f:
        return json.load(f)


def _record(gang, attempt=None):
    return gang.client(
        "import json\nfrom metaflow import Task\n"
        "t = [t for t in Flow('CheckpointFlow').latest_run['train'] if t.id.isdigit()][0]\n"
        "t = Task(t.pathspec, attempt=%r) if %r is not None else t\n"
        "result = json.loads(t.metadata_dict['torchrun-result'])" % (attempt, attempt))


def _resumes_after_kill(gang, kill_node, resumed_from=2, restarts=0, nproc=2, ckpt_card=False, **options):
    ckpt = dict({"kill-after-epoch": 2, "kill-node": kill_node, "epochs": 3}, **options)
    env = {"MFTR_CKPT": json.dumps(ckpt), "MFTR_RETRY_ON": "infrastructure", "MFTR_RESTARTS": str(restarts),
           "MFTR_CKPT_NPROC": str(nproc), "MFTR_CKPT_CARD": "1" if ckpt_card else "0"}
    proc = gang.run(flow=FLOW, env=env, timeout=400)
    text = output(proc)
    assert proc.returncode == 0, text[-5000:]
    events = _events(gang)
    starts = {(e["attempt"], e["rank"]): e for e in events if e["event"] == "start"}
    # Attempt 0 trained from scratch; attempt 1, on every rank, from epoch 2's checkpoint.
    assert all(starts[(0, r)]["resumed_from"] is None for r in range(2 * nproc)), starts
    assert all(starts[(1, r)]["resumed_from"] == resumed_from for r in range(2 * nproc)), starts
    trained = sorted({e["epoch"] for e in events if e["event"] == "epoch" and e["attempt"] == 1})
    assert trained == list(range(resumed_from + 1, 4)), trained
    # Global rank 0 on node 0 and ranks in node order, in both attempts: the
    # idiom of saving rank 0's file from node 0's step relies on it.
    assert all(e["metaflow_node"] == e["rank"] // nproc == e["node"] for e in starts.values()), starts
    # Both nodes of attempt 1 loaded the same checkpoint, under one identity.
    nodes = [_loaded(gang, n, 1) for n in (0, 1)]
    assert all(n["is_loaded"] for n in nodes) and nodes[0]["key"] == nodes[1]["key"], nodes
    assert "control task id is not set" not in text
    return text


def test_a_killed_worker_resumes_from_the_last_epoch_even_under_retry_on_infrastructure(gang):
    """With in-step restarts allowed too: a lost node ends the attempt (a
    restart needs every task alive), and @retry resumes."""
    text = _resumes_after_kill(gang, kill_node=1, restarts=2, ckpt_card=True)  # @checkpoint's card beside ours
    assert "restarting" not in text, text[-3000:]
    record = _record(gang)
    attempts = record["attempts"]
    assert [a["attempt"] for a in attempts] == [0, 1], attempts
    assert "disconnected" in attempts[0]["stopped"], attempts[0]
    assert attempts[0]["restart_seconds"] > 0 and attempts[0]["lost_work_seconds"] >= 0, attempts[0]
    assert attempts[1]["resumed_from"]["metadata"] == {"epoch": 2}, attempts[1]
    assert attempts[1]["stopped"] == "succeeded" and attempts[1]["calls"], attempts[1]
    assert attempts[1]["gang_formed_seconds"] is not None
    _ledger_matches_the_kill(gang, record)
    # @checkpoint's own card and ours, side by side on the control's final attempt, as users get them.
    cards = gang.client(
        "from metaflow.cards import get_cards\n"
        "t = [t for t in Flow('CheckpointFlow').latest_run['train'] if t.id.isdigit()][0]\n"
        "result = sorted(c.id for c in get_cards(t))")
    assert "task_checkpoints" in cards and "torchrun" in cards, cards


def _ledger_matches_the_kill(gang, record):
    """The goodput ledger (record/goodput.py) of the same run: its parts add
    up to the wall time, and what it counts lost is the injected failure's."""
    ledger = record["goodput"]
    parts = ledger["parts"]
    assert abs(sum(parts.values()) - ledger["wall_seconds"]) < 1.0, ledger
    first, second = ledger["segments"]
    assert abs(sum(first["parts"].values()) + sum(second["parts"].values()) - ledger["wall_seconds"]) < 1.0
    events = _events(gang)
    kill = [e for e in events if e["event"] == "kill"][0]["t"]
    saved = max(e["t"] for e in events if e["event"] == "saved" and e["attempt"] == 0 and e["epoch"] == 2)
    resumed = min(e["t"] for e in events if e["event"] == "start" and e["attempt"] == 1)
    # Work since epoch 2's checkpoint to the kill (its detection takes a moment more).
    assert 0 <= first["parts"]["lost_work"] - (kill - saved) < 3.0, (first, kill - saved)
    # From the failure to attempt 1's first line: the stop, Metaflow's retry, the new gang's start.
    assert abs(first["time_to_restart"] - (resumed - kill)) < 3.0, (first, resumed - kill)
    assert abs(parts["lost_work"] + parts["stop"] + parts["restart"] - ledger["lost_seconds"]) < 0.01
    assert second["cause"] is None and parts["productive"] > 0 and 0 < ledger["effective_percent"] < 100
    assert first["cause"] and "disconnected" in first["cause"]
    # The same ledger as task metadata and as an artifact of the control task.
    same = gang.client(
        "import json\nfrom metaflow import Flow\n"
        "t = [t for t in Flow('CheckpointFlow').latest_run['train'] if t.id.isdigit()][0]\n"
        "result = {'meta': json.loads(t.metadata_dict['torchrun-goodput']), 'artifact': t['torchrun_goodput'].data}")
    assert same["meta"] == same["artifact"] == ledger


def test_a_kill_of_the_saving_node_during_a_save_resumes_from_the_save_before(gang):
    """Node 0 (rank 0 saves) dies in the middle of epoch 2's save: that save
    never became the latest, so attempt 1 resumes from epoch 1. Also the test
    that a killed control task resumes from its last whole checkpoint."""
    # One process a node: who saves and who dies are nodes (rank 0 saves).
    _resumes_after_kill(gang, kill_node=0, resumed_from=1, nproc=1, **{"kill-during-save": True, "save-seconds": 20})


def test_our_stop_during_a_save_resumes_from_the_save_before(gang):
    """Node 1 dies while rank 0 is saving epoch 2: the gang stops rank 0 in its
    save (a failure elsewhere gives it the supervisor's 3 s, then SIGKILL; the
    save takes 20), so attempt 1 resumes from epoch 1."""
    _resumes_after_kill(gang, kill_node=1, resumed_from=1, nproc=1, **{"kill-during-save": True, "save-seconds": 20})
    saved = [e["epoch"] for e in _events(gang) if e["event"] == "saved" and e["attempt"] == 0]
    assert saved == [1], saved


def test_a_bug_is_not_retried_under_retry_on_infrastructure(gang):
    env = {"MFTR_CKPT_BUG": "1", "MFTR_RETRY_ON": "infrastructure", "MFTR_RETRIES": "2"}
    proc = gang.run(flow=FLOW, env=env, timeout=400)
    text = output(proc)
    assert proc.returncode != 0
    bug_line = [i for i, l in enumerate(open(os.path.join(os.path.dirname(__file__), "..", "flows", FLOW)), 1)
                if "a bug in the step's own code" in l][0]
    why = ("attempt 0 failed in your code, ValueError at checkpoint_flow.py:%d, and "
           "@torchrun(retry_on='infrastructure') retries only infrastructure failures." % bug_line)
    # One statement per refused attempt, under one headline: attempt 1 says what
    # Metaflow does next (it starts attempt 2 anyway), once; attempt 2 names attempt 0 too.
    first = "attempt 1 ran nothing: " + why + " Metaflow's @retry still starts attempt 2, which ends"
    assert text.count(first) == 1, text[-5000:]
    assert text.count("attempt 2 ran nothing: " + why + "\n") == 1, text[-5000:]
    assert text.count("@torchrun: not retried") == 4, text[-5000:]  # node 0's and node 1's, per attempt
    assert text.count("not retried") == 4 and text.count("retries only infrastructure failures") == 2
    assert text.count("node 1 ran nothing: node 0's error in this log says why") == 2, text[-5000:]
    assert "Traceback" not in text.split("Task is starting (retry)", 1)[1], text[-5000:]
    # The refused attempts ran no step code and started no rank.
    assert not os.path.exists(os.path.join(gang.out, "loaded-0-1.json"))
    assert not os.path.exists(os.path.join(gang.out, "epochs.jsonl"))


def test_a_bug_is_retried_under_retry_on_any(gang):
    env = {"MFTR_CKPT_BUG": "1", "MFTR_RETRIES": "1"}
    proc = gang.run(flow=FLOW, env=env, timeout=400)
    assert proc.returncode != 0
    assert os.path.exists(os.path.join(gang.out, "loaded-0-1.json")), output(proc)[-3000:]
    assert "not retried" not in output(proc)


def test_eager_load_gives_both_nodes_the_same_checkpoint(gang):
    gang.env["MFTR_CKPT_NPROC"] = "1"  # what both nodes load is the question, not their ranks
    first = gang.run(flow=FLOW, env={"MFTR_CKPT": json.dumps({"epochs": 1})}, timeout=300)
    assert first.returncode == 0, output(first)[-4000:]
    os.remove(os.path.join(gang.out, "epochs.jsonl"))
    proc = gang.run(flow=FLOW, env={"MFTR_CKPT": json.dumps({"epochs": 1}), "MFTR_CKPT_POLICY": "eager"},
                    timeout=300)
    text = output(proc)
    assert proc.returncode == 0, text[-4000:]
    nodes = [_loaded(gang, n, 0) for n in (0, 1)]
    assert nodes[0]["identity"] == nodes[1]["identity"], nodes
    assert nodes[0]["is_loaded"] and nodes[1]["is_loaded"], nodes
    assert nodes[0]["key"] == nodes[1]["key"], nodes
    assert "control task id is not set" not in text
