"""A restart resumes at the step it failed on, from the state the ranks kept in their nodes' memory
(``metaflow_extensions.torchrun.snapshot``), not from a checkpoint: real 2 x 2 DDP flows on gloo, a
48 MB state (weights and momentum), a snapshot every step, and examples/fsdp (FSDP2's shards). Each
run's final weights are compared bit for bit with an uninterrupted run of the same seeds: a restart
that resumed anywhere but at a step the gang completed, or from a torn copy, ends with other weights."""

import json
import os
import socket
import subprocess
import sys

import pytest

from .helpers import FLOWS, REPO, output

pytestmark = pytest.mark.integration

STEPS = 10
KILL_AFTER = 5
SCRIPT_ARGS = ["--steps", str(STEPS), "--kill-after", str(KILL_AFTER)]


def _uninterrupted(script, args, out):
    """One plain torchrun of 4 ranks of ``script``: the same ranks, seeds and collectives as a 2 x 2 flow's,
    and no store, so ``save`` keeps nothing and ``load`` finds nothing."""
    env = dict(os.environ, MFTR_TEST_OUT=out, METAFLOW_TORCHRUN_NODE_INDEX="0", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.join(FLOWS, "scripts"), os.environ.get("PYTHONPATH", "")]))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port",
                           str(port), script] + args, env=env, capture_output=True, timeout=300)
    assert proc.returncode == 0, output(proc)[-3000:]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The weights' digest of the same training with no failure."""
    out = str(tmp_path_factory.mktemp("uninterrupted"))
    _uninterrupted(os.path.join(FLOWS, "scripts", "snapshot_train.py"), SCRIPT_ARGS[:2], out)
    with open(os.path.join(out, "final.json")) as f:
        return json.load(f)["digest"]


def _run(gang, attrs, *script_args, nodes=2):
    gang.env["MFTR_TORCHRUN_ATTRS"] = json.dumps(attrs)
    proc = gang.run("--script", "snapshot_train.py", "--nodes", str(nodes), "--nproc", "2",
                    "--script-args", json.dumps(SCRIPT_ARGS + list(script_args)), timeout=400)
    text = output(proc)
    assert proc.returncode == 0, text[-4000:]
    return text


def _final(gang):
    with open(os.path.join(gang.out, "final.json")) as f:
        return json.load(f)["digest"]


def _starts(gang, restart):
    return {r: report for r, report in gang.reports("start-%d-rank-" % restart).items()}


def _restart_record(gang):
    """The control's record of each restart, and its goodput ledger's segments."""
    return gang.client(
        "import json\n"
        "t = Flow('GangFlow').latest_run['train'].control_task\n"
        "result = (json.loads(t.metadata_dict['torchrun-result'])['in_step_restarts'],\n"
        "          json.loads(t.metadata_dict['torchrun-goodput'])['segments'])"
    )


def test_a_killed_rank_resumes_at_its_last_snapshot_one_timeline_and_a_torn_one_is_never_loaded(gang, uninterrupted):
    """Start 0: rank 3 (node 1) dies in its save of step 5, its snapshot torn, so every rank resumes at step 4,
    which all of them hold whole. Start 1: rank 1 (node 0) dies in its save of step 5 too: it keeps start 0's
    step 5, while the other ranks hold start 1's, so each holds a step 5 of another start; start 2 resumes
    at the step 4 of start 0 they all hold, one timeline (it was at step 5, start 0's on some ranks and
    start 1's on the others: DDP replicas that drift where a restart's step differs in its last bits). Start 2:
    rank 1 dies after step 7 saved; start 3 resumes there, 0 steps lost. The final weights and momentum are an
    unbroken run's, bit for bit. Start 0's ranks also call load() after step 3: the newest step every rank
    holds, said as no resume (it was `resumed at step 3 ...`)."""
    text = _run(gang, {"restarts": 3}, "--kills", "0:3:%d:save,1:1:%d:save,2:1:7" % (KILL_AFTER, KILL_AFTER),
                "--load-mid", "3")
    assert gang.reports("mid-load-rank-") == {r: {"step": 3} for r in range(4)}
    assert "resumed at step 3" not in text, text[-3000:]
    after_torn, after_second, after_kill = _starts(gang, 1), _starts(gang, 2), _starts(gang, 3)
    assert sorted(after_torn) == sorted(after_second) == sorted(after_kill) == [0, 1, 2, 3], (after_torn, after_kill)
    assert all(s["from_memory"] and s["resumed"] == KILL_AFTER - 1 for s in after_torn.values()), after_torn
    # One timeline: every rank resumed from the same start's snapshot.
    assert [(s["resumed"], s["saved_in"]) for s in after_second.values()] == [(KILL_AFTER - 1, 0)] * 4, after_second
    assert all(s["from_memory"] and s["resumed"] == 7 and s["saved_in"] == 2 for s in after_kill.values()), after_kill
    assert "resumed at step 7 from memory (this node's copy), 0 steps lost" in text, text[-3000:]
    assert _final(gang) == uninterrupted
    restarts, segments = _restart_record(gang)
    assert [(r["resumed_step"], r["steps_lost"]) for r in restarts] == [(KILL_AFTER - 1, 1)] * 2 + [(7, 0)], restarts
    # The ledger counts the work up to each snapshot as kept: lost is the time since it was saved (under a
    # second or two here), not each start's whole run.
    assert all(r["resumed_saved_at"] <= r["failed_at"] and r["lost_work_seconds"] < 5 for r in restarts), restarts
    assert [s.get("steps_lost") for s in segments[:3]] == [1, 1, 0] and segments[0]["parts"]["productive"] > 0, (
        segments)
    # Each new start trains from its ranks' first snapshot: what came before it (imports, the process group,
    # the model, the load) is the restart's in the ledger, not training. From the stop, or from the failure
    # where the gang's cause is stamped after this node's ranks had stopped (a rank's death is reported once
    # torchrun's agent has stopped the rest: the ledger's stop part is then 0).
    assert all(r["ranks_at"] < r["trained_at"] for r in restarts), restarts
    for s, r in zip(segments[1:], restarts):
        assert s["parts"]["restart"] >= r["trained_at"] - max(r["stopped_at"], r["failed_at"]) - 0.01, (
            s["parts"], {k: r[k] for k in ("failed_at", "stopped_at", "ranks_at", "trained_at")})


def test_a_spare_resumes_from_the_replaced_nodes_state_held_on_a_peer(gang, uninterrupted):
    """Node 1's ranks die at every start; the spare that takes its place has no state of its own and
    fetches node 1's (replicated: its buddy node 0 holds the same) over the gang's authenticated channel."""
    text = _run(gang, {"restarts": 1, "spares": 1}, "--bad-node", "1", nodes=3)
    starts = _starts(gang, 1)
    assert {s["node"] for s in starts.values()} == {0, 2}, starts  # the spare, node 2, in node 1's place
    assert all(s["from_memory"] and s["resumed"] == KILL_AFTER for s in starts.values()), starts
    assert "resumed at step %d from memory" % KILL_AFTER in text, text[-3000:]
    assert _final(gang) == uninterrupted
    restart = _restart_record(gang)[0][0]  # the control's record: whose copy the spare fetched, as the docs say
    assert restart["swapped_in"] == 2 and restart["resumed_step"] == KILL_AFTER, restart
    assert restart["resumed_from"] == 0, restart  # node 1's buddy, which holds the replicated state too


FSDP_EXAMPLE = os.path.join(REPO, "examples", "fsdp")


def test_fsdp2_shards_resume_from_memory_as_dtensors_bit_for_bit(gang, tmp_path):
    """examples/fsdp as shipped: FSDP2 (``fully_shard``) with Adam on 2 x 2, each rank's shards saved every step
    (``replicated=False``); rank 3 dies after step 6, and the restart's ranks load their shards as DTensors
    into fresh FSDP2 models and optimizers (plain tensors: ``load_state_dict`` refused them, and the restart
    failed). The final model and Adam state (every tensor gathered whole) are an unbroken run's, bit for bit."""
    metrics = str(tmp_path / "uninterrupted.json")
    _uninterrupted(os.path.join(FSDP_EXAMPLE, "train.py"), ["--metrics-out", metrics], str(tmp_path))
    with open(metrics) as f:
        unbroken = json.load(f)
    proc = gang.run("--kill-at-step", "6", flow=os.path.join(FSDP_EXAMPLE, "flow.py"), timeout=400)
    text = output(proc)
    assert proc.returncode == 0, text[-4000:]
    assert "resumed at step 6 from memory (this node's copy), 0 steps lost" in text, text[-3000:]
    resumed = gang.client("result = Flow('FSDPTrain').latest_run['join'].task.data.metrics")
    assert resumed["resumed_from"] == 6 and unbroken["resumed_from"] == 0, (resumed, unbroken)
    assert resumed["state_sha256"] == unbroken["state_sha256"], (resumed, unbroken)
