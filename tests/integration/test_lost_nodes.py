"""A node's task lost mid-training (its task and every process of its node SIGKILLed, as when a host is
pulled) is not the end of the step where the step can go on without it: a spare takes its place, or,
with ``min_nodes``, the gang trains on the nodes that remain. The local control stands in for a Job
controller and starts the lost node's task again: it rejoins as a spare, the gang grows back to its
size, and the step and its join (``len(inputs)``, ``merge_artifacts``) succeed. (The same loss with
neither option ends the attempt: test_gang_failures.py, and the service's rule in test_node_loss.py.)

Real 3-node x 2-process flows on gloo (tests/flows/lost_node_flow.py, snapshot_train.py: DDP with a
snapshot every step)."""

import json
import os
import re
import signal
import time

import pytest
from our_processes import argv, node_processes, node_tasks

from metaflow_extensions.torchrun.plugins.torchrun.host.private import in_use

from .helpers import finish_or_explain, without_task_prefix

pytestmark = pytest.mark.integration

FLOW = "lost_node_flow.py"
FLOW_TIMEOUT = 300
# Long enough that the loss, the swap and the node's return all happen mid-training.
SCRIPT_ARGS = ["--steps", "60", "--mb", "2", "--step-sleep", "0.2", "--mark-steps"]

_JOIN = r"""
run = Flow('LostNodeFlow').latest_run
join = run['join'].task
result = {'successful': run.successful, 'count': join['count'].data, 'roles': join['roles'].data,
          'dataset': join['dataset'].data,
          'tasks': sorted((t['node'].data, t.successful) for t in run['train'])}
control = [t for t in run['train'] if '_node_' not in t.id][0]
result['restarts'] = json.loads(control.metadata_dict['torchrun-result'])['in_step_restarts']
from metaflow_extensions.torchrun.history import history  # what `torchrun history --json` prints
result['history'] = {h['host']: h['roles'] for h in history('LostNodeFlow', last=1)['hosts']}
"""


def _task_of(run_pid, node):
    """The Metaflow task of worker ``node`` (its command's ``--split-index``)."""
    for pid in node_tasks(run_pid, control=False):
        args = argv(pid)
        if "--split-index" in args and args[args.index("--split-index") + 1] == str(node):
            return pid
    raise AssertionError("no task for node %d" % node)


def _pull_host(run_pid, node):
    """Every process of the node at once, as a host that is pulled."""
    task = _task_of(run_pid, node)
    for pid in [task] + node_processes(task):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait_for_step(gang, ranks, step, timeout=180.0, poll=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        at = gang.reports("at-rank-")
        if len(at) >= ranks and all(r["step"] >= step for r in at.values()):
            return
        time.sleep(poll)
    raise AssertionError("the ranks did not reach step %d: %r" % (step, gang.reports("at-rank-")))


def _lose_node(gang, attrs, node, script_args=SCRIPT_ARGS):
    gang.env["MFTR_TORCHRUN_ATTRS"] = json.dumps(attrs)
    gang.env["TMPDIR"] = _tmpdir(gang)  # what the lost node's task leaves there is the test's to see
    proc = gang.start("--nodes", "3", "--script-args", json.dumps(script_args), flow=FLOW)
    try:
        _wait_for_step(gang, 4, 3)
        _pull_host(proc.pid, node)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    text = without_task_prefix(finish_or_explain(proc, gang, FLOW_TIMEOUT).decode(errors="replace"))
    assert proc.returncode == 0, text[-5000:]
    return text


def _history_of(joined, node):
    """A local node's roles in the run's node history: this host's name, then its index (`vm (node 1)`)."""
    return next(roles for host, roles in joined["history"].items() if host.endswith("(node %d)" % node))


def _starts(gang, restart):
    return gang.reports("start-%d-rank-" % restart)


def _tmpdir(gang):
    path = os.path.join(gang.tmp, "tmpdir")
    os.makedirs(path, exist_ok=True)
    return path


def _snapshot_sockets_left(gang):
    """The snapshot stores' socket directories left in the run's TMPDIR: at its top (a ``mkdtemp`` each, which
    nothing sweeps), and in the private work tree (which the next call on the host sweeps once no process
    holds them)."""
    top = [name for name in os.listdir(_tmpdir(gang)) if name.startswith("mftr-snap")]
    work = os.path.join(_tmpdir(gang), "metaflow-torchrun-%d" % os.geteuid(), "work")
    held = [d for d in (os.listdir(work) if os.path.isdir(work) else [])
            if os.path.exists(os.path.join(work, d, "snapshot.sock"))]
    return top, [os.path.join(work, d) for d in held]


def test_a_lost_node_is_replaced_by_the_spare_and_comes_back_as_one(gang):
    text = _lose_node(gang, {"restarts": 2, "spares": 1}, node=1)
    assert re.search(r"call 1: node 1 \([^)]*\) taken out, spare node 2 \([^)]*\) brought in \(restart 1 of 2\): "
                     r"node 1 \([^)]*\) disconnected before its step ended", text), text[-5000:]
    assert "node 1's task was killed (SIGKILL): starting it again" in text, text[-5000:]
    assert re.search(r"node 1 \([^)]*\) is back after it was lost: a spare now", text), text[-5000:]
    again = _starts(gang, 1)
    assert sorted(again) == [0, 1, 2, 3], again
    assert {again[r]["node"] for r in (2, 3)} == {2}, again  # the spare holds node 1's ranks
    assert all(s["from_memory"] and s["resumed"] >= 3 and s["world"] == 4 for s in again.values()), again
    joined = gang.client(_JOIN)
    assert joined["successful"] and joined["count"] == 3 and joined["dataset"] == "toy", joined
    assert joined["tasks"] == [[0, True], [1, True], [2, True]], joined
    assert joined["roles"] == {"0": "active", "1": "spare", "2": "active"}, joined
    (swap,) = joined["restarts"]  # the control's record, which the card and the ledger are drawn from
    assert swap["kind"] == "node_lost" and swap["swapped_out"] == 1 and swap["swapped_in"] == 2, swap
    assert swap["resumed_step"] >= 3 and swap["steps_lost"] == 0, swap
    # The killed task never closed its store: its socket's directory is in the work tree, held by no live
    # process, for the next call's sweep (it was a mftr-snap-* at TMPDIR's top, there for good).
    top, held = _snapshot_sockets_left(gang)
    assert top == [] and len(held) == 1, (top, held)
    assert not in_use(held[0], 0), held
    # The node history names the lost node, though it came back and the step succeeded (was: a bystander).
    assert _history_of(joined, 1) == {"lost": 1}, joined["history"]


def test_without_a_spare_the_gang_goes_on_smaller_and_grows_back(gang):
    text = _lose_node(gang, {"restarts": 3, "min_nodes": 2}, node=2)
    assert re.search(r"call 1: node 2 \([^)]*\) disconnected before its step ended: its task died or was killed; "
                     r"the gang trains on without it, on 2 nodes \(world size 4, restart 1 of 3\)", text), text[-5000:]
    assert re.search(r"call 1: node 2 \([^)]*\) back: the gang grows to 3 nodes again \(world size 6, restart 2 "
                     r"of 3\)", text), text[-5000:]
    smaller, grown = _starts(gang, 1), _starts(gang, 2)
    assert sorted(smaller) == [0, 1, 2, 3] and all(s["world"] == 4 for s in smaller.values()), smaller
    assert {s["node"] for s in smaller.values()} == {0, 1}, smaller
    assert all(s["from_memory"] and s["resumed"] >= 3 for s in smaller.values()), smaller
    assert sorted(grown) == list(range(6)) and all(s["world"] == 6 for s in grown.values()), grown
    assert {grown[r]["node"] for r in (4, 5)} == {2}, grown
    assert all(s["from_memory"] for s in grown.values()), grown  # node 2's ranks from a peer's copy
    joined = gang.client(_JOIN)
    assert joined["successful"] and joined["count"] == 3, joined
    assert joined["tasks"] == [[0, True], [1, True], [2, True]], joined
    assert joined["roles"] == {"0": "active", "1": "active", "2": "active"}, joined
    lost, regrown = joined["restarts"]
    assert lost["kind"] == "node_lost" and "the gang trains on without it, on 2 nodes" in lost["stopped"], lost
    # Right after a snapshot: at most the step the ranks saved while they were told to stop (1 under load).
    assert regrown["kind"] == "regrown" and regrown["steps_lost"] <= 1, regrown
    assert _history_of(joined, 2) == {"lost": 1}, joined["history"]  # the gang went on without it


def test_with_sharded_state_the_gang_goes_on_smaller_and_never_rewinds_to_before_the_loss(gang):
    """Each rank's state saved as its shard (``replicated=False``, FSDP's way), min_nodes=2: node 2 lost, the
    4 ranks left hold no shard of 4 ranks (their 6-rank shards dropped, here and on the buddy) and resume from
    the checkpoint (none here: step 0), said once. Node 2 back is a spare: a gang grown back to 6 could load
    no shard newer than the loss, so it trains on at 4, said once. (It grew back, and the ranks resumed from
    the 6-rank shards of before the loss, kept on the survivors and the buddy: every step trained at 4 lost.)"""
    text = _lose_node(gang, {"restarts": 3, "min_nodes": 2}, node=2, script_args=SCRIPT_ARGS + ["--sharded"])
    assert "the gang trains on without it, on 2 nodes (world size 4, restart 1 of 3)" in text, text[-5000:]
    assert "no snapshot in memory that every rank holds: resuming from your checkpoint" in text, text[-5000:]
    assert re.search(r"node 2 \([^)]*\) is back after it was lost: a spare now", text), text[-5000:]
    assert text.count("the gang does not grow back to 6 ranks: its ranks' snapshots are shards of 4 ranks") == 1, (
        text[-5000:])
    assert "grows to 3 nodes again" not in text and _starts(gang, 2) == {}, text[-5000:]
    smaller = _starts(gang, 1)
    assert sorted(smaller) == [0, 1, 2, 3] and not any(s["from_memory"] for s in smaller.values()), smaller
    at = gang.reports("at-rank-")  # the ranks' last step: the whole run, at 4 ranks after the loss
    assert {r: (a["restart"], a["step"], a["world"]) for r, a in at.items() if r < 4} == {
        r: (1, 60, 4) for r in range(4)}, at
    joined = gang.client(_JOIN)
    assert joined["successful"] and joined["roles"] == {"0": "active", "1": "active", "2": "spare"}, joined

