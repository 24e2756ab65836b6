"""@torchrun(spares=K) in real flows (issue 54): three Metaflow nodes of two
processes each, two of them training and one a hot spare. A "bad GPU" on node
1 (its ranks SIGKILL themselves after their first step, every time they start
there) is taken out and the spare trains in its place from the checkpoint;
without a spare the same job fails once its restarts run out; a node that
preflight finds unfit is replaced before any rank starts; a node 0 failure
restarts in place and a bug in the user's code is not swapped (one flow for
these two: the bug comes at the restart the node 0 failure caused).

Four flows. Which node a rank ran on, with which node rank, global rank,
restart and resumed step, comes from restart_resume.py's events (one line per
rank per start); each task's role from its ``torchrun-result`` record."""

import base64
import json
import os
import re
import subprocess

import pytest

from .helpers import finish_or_explain, output, without_task_prefix

pytestmark = pytest.mark.integration

SCRIPT = "restart_resume.py"
NODES = 3  # num_parallel: two train, one is the spare
# Under pytest's own 300 s: a run that does not end fails with what it printed
# and where each of its processes waits, not with pytest's bare timeout.
FLOW_TIMEOUT = 240
# No failure but the one each test asks for (restart_resume.py's own default
# SIGKILLs rank 3 at restarts 0 and 1).
QUIET = {"fail-at": "", "steps": 3}
# The console's one line per swap; the host's name is the machine's.
SWAP_LINE = re.compile(r"@torchrun: call 1: node 1 \([^)]*\) taken out, spare node 2 \([^)]*\) brought in "
                       r"\(restart 1 of 1\): node 1 \([^)]*\), rank [23] .*killed by signal SIGKILL")


def _run(gang, attrs, env=None, **script_args):
    gang.env.update(env or {}, MFTR_TORCHRUN_ATTRS=json.dumps(attrs))
    proc = gang.start("--script", SCRIPT, "--nodes", str(NODES), "--nproc", "2",
                      "--script-args", json.dumps(dict(QUIET, **script_args)))
    out = finish_or_explain(proc, gang, FLOW_TIMEOUT)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, b"")


def _events(gang):
    path = os.path.join(gang.out, "events.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _starts(events):
    """Per start (restart count): {Metaflow node: node rank}, the global ranks
    and where global rank 0 ran, the world size and the steps resumed from."""
    starts = {}
    for e in events:
        s = starts.setdefault(e["restart"], {"nodes": {}, "ranks": [], "rank0_node": None,
                                             "world_size": set(), "resumed_from": set()})
        s["nodes"].setdefault(e["node"], set()).add(e["group_rank"])
        s["ranks"].append(e["rank"])
        s["world_size"].add(e["world_size"])
        s["resumed_from"].add(e["resumed_from"])
        if e["rank"] == 0:
            s["rank0_node"] = e["node"]
    for s in starts.values():
        s["ranks"].sort()
    return starts


def _tasks(gang):
    """Per Metaflow node: whether its task succeeded, and its record."""
    found = gang.client(
        "r = Flow('GangFlow').latest_run\n"
        "result = {'run_successful': r.successful, 'tasks': []}\n"
        "for t in r['train']:\n"
        "    rec = t.metadata_dict.get('torchrun-result')\n"
        "    result['tasks'].append({'id': t.id, 'successful': t.successful, 'finished': t.finished,\n"
        "                            'attempt': t.current_attempt,\n"
        "                            'roles': list(t['torch_roles'].data) if 'torch_roles' in t else None,\n"
        "                            'line': t['result_line'].data if 'result_line' in t else None,\n"
        "                            'record': json.loads(rec) if rec else None})\n")
    by_node = {}
    for task in found["tasks"]:
        record = task["record"]
        assert record is not None, "a task without its torchrun-result record: %s" % found
        by_node[record["node_index"]] = task
    assert sorted(by_node) == list(range(NODES)), found
    return found["run_successful"], by_node


def _control_card(gang):
    """The control's card, from the data Metaflow embeds in its page: its markdown, the Topology and
    Ranks tables, the timeline's bars and marks."""
    page = gang.client(
        "from metaflow.cards import get_cards\n"
        "t = Flow('GangFlow').latest_run['train'].control_task\n"
        "result = get_cards(t, id='torchrun')[0].get()")
    data = re.search(r'__MF_DATA__\["[^"]+"\] = "([^"]+)"', page).group(1)
    parts = json.loads(base64.b64decode(data))["components"][0]["contents"][0]["contents"]
    tables = [(tuple(p["columns"]), p["data"]) for p in parts if p["type"] == "table"]
    chart = next(p["spec"] for p in parts if p["type"] == "vegaChart" and "nodes and ranks" in json.dumps(p["spec"]))
    layers = chart["layer"]
    return {"markdown": [p.get("source", "") for p in parts if p["type"] == "markdown"],
            "topology": dict(map(tuple, next(d for _, d in tables if any(r[0] == "restarts" for r in d)))),
            "ranks": next(d for c, d in tables if c[:2] == ("rank", "node")),
            "bars": next(lay["data"]["values"] for lay in layers if lay["mark"]["type"] == "bar"),
            "marks": [v["label"] for lay in layers if lay["mark"]["type"] == "text" for v in lay["data"]["values"]]}


def _bench(record):
    return record.get("spare_nodes"), record.get("out_nodes")


def test_a_bad_gpu_on_node_1_is_swapped_for_the_spare_which_resumes_from_the_checkpoint(gang):
    proc = _run(gang, {"restarts": 1, "spares": 1}, **{"bad-node": 1})
    text = without_task_prefix(output(proc))
    assert proc.returncode == 0, text[-5000:]
    assert len(SWAP_LINE.findall(text)) == 1, text[-5000:]
    starts = _starts(_events(gang))
    assert sorted(starts) == [0, 1], starts
    first, last = starts[0], starts[1]
    # The first start: nodes 0 and 1 train (node ranks 0 and 1), node 2 waits; WORLD_SIZE counts
    # the two active nodes' ranks only.
    assert first["nodes"] == {0: {0}, 1: {1}} and first["ranks"] == [0, 1, 2, 3], starts
    assert first["world_size"] == {4} and first["resumed_from"] == {None}, starts
    # The swap: node 1 out, node 2 in as node rank 1; global rank 0 still on node 0; every rank
    # resumed from the step all of them saved before node 1's ranks died.
    assert last["nodes"] == {0: {0}, 2: {1}} and last["ranks"] == [0, 1, 2, 3], starts
    assert last["rank0_node"] == 0 and last["world_size"] == {4}, starts
    assert last["resumed_from"] == {1}, starts
    done = gang.reports("done-")
    assert sorted(done) == [0, 1, 2, 3] and all(d["restart"] == 1 for d in done.values()), done
    # Every task succeeded, the spare's and the node taken out's too, and each says its role.
    successful, tasks = _tasks(gang)
    assert successful and all(t["successful"] and t["attempt"] == 0 for t in tasks.values()), tasks
    roles = {n: t["record"].get("role") for n, t in tasks.items()}
    assert roles == {0: "active", 1: "out", 2: "active"}, roles
    # print(result) on the node taken out: it ran its ranks until the swap (it said "not run").
    assert "node 1 of 3, taken out," in tasks[1]["line"], tasks[1]["line"]
    # What the step's code read of current.torch.role, before its call and after it.
    seen = {n: t["roles"] for n, t in tasks.items()}
    assert seen == {0: ["active", "active"], 1: ["active", "out"], 2: ["spare", "active"]}, seen
    assert all(_bench(t["record"]) == ([], [1]) for t in tasks.values()), tasks
    # The control's record: one restart, a swap of node 1 for node 2, for node 1's SIGKILL.
    restarts = tasks[0]["record"]["in_step_restarts"]
    assert len(restarts) == 1, restarts
    swap = restarts[0]
    assert swap.get("swapped_out") == 1 and swap.get("swapped_in") == 2, swap
    assert swap["cause"].get("node_index") == 1 and "SIGKILL" in swap["stopped"], swap
    assert tasks[0]["record"]["restarts"] == 1 and tasks[0]["record"]["cause"] is None


def test_the_same_bad_gpu_without_a_spare_fails_once_the_restarts_run_out(gang):
    proc = _run(gang, {"restarts": 1, "spares": 0}, **{"bad-node": 1})
    text = without_task_prefix(output(proc))
    assert proc.returncode != 0, text[-5000:]
    starts = _starts(_events(gang))
    # Both starts on the same three nodes, node 1 among them: nothing swapped.
    assert sorted(starts) == [0, 1], starts
    for s in starts.values():
        assert s["nodes"] == {0: {0}, 1: {1}, 2: {2}} and s["world_size"] == {6}, starts
    assert starts[1]["resumed_from"] == {1}, starts
    assert "restarting every node's ranks (restart 1 of 1)" in text, text[-5000:]
    assert "SIGKILL" in text and "taken out" not in text and "brought in" not in text, text[-5000:]
    assert not gang.reports("done-")


def test_a_node_unfit_in_preflight_is_replaced_by_the_spare_before_any_rank_starts(gang):
    # Node 1 has another torch (the fingerprint preflight compares); nodes 0 and 2 agree.
    proc = _run(gang, {"restarts": 1, "spares": 1},
                env={"METAFLOW_TORCHRUN_FAKE_FINGERPRINT_TORCH": "1=2.12.0"})
    text = without_task_prefix(output(proc))
    assert proc.returncode == 0, text[-5000:]
    # Said once each: which node went out and why, and which spare came in.
    assert text.count("@torchrun: preflight: node 1 (") == 1, text[-5000:]
    assert re.search(r"@torchrun: preflight: node 1 \([^)]*\) taken out before any rank started: "
                     r"torch: node 1 has 2\.12\.0", text), text[-5000:]
    assert text.count("@torchrun: preflight: spare node 2 brought in") == 1, text[-5000:]
    assert "restart 1 of" not in text, text[-5000:]  # no restart, no swap after the start
    starts = _starts(_events(gang))
    # One start, on nodes 0 and 2: no rank ever ran on node 1, nothing was restarted.
    assert sorted(starts) == [0], starts
    assert starts[0]["nodes"] == {0: {0}, 2: {1}} and starts[0]["rank0_node"] == 0, starts
    assert starts[0]["world_size"] == {4} and starts[0]["resumed_from"] == {None}, starts
    assert len(gang.reports("done-")) == 4
    successful, tasks = _tasks(gang)
    assert successful and all(t["successful"] for t in tasks.values()), tasks
    roles = {n: t["record"].get("role") for n, t in tasks.items()}
    assert roles == {0: "active", 1: "out", 2: "active"}, roles
    assert not tasks[1]["record"]["ranks"], tasks[1]["record"]["ranks"]
    assert all(not t["record"]["in_step_restarts"] for t in tasks.values()), tasks


def test_a_node_0_failure_restarts_in_place_and_a_bug_is_not_swapped(gang):
    # Start 0: rank 0 (node 0) SIGKILLed after step 1: a restart in place, the spare unused.
    # Start 1: rank 2 (node 1) raises ValueError after step 2: a bug, with a restart and a
    # spare left, neither used.
    proc = _run(gang, {"restarts": 2, "spares": 1},
                **{"fail-rank": 0, "fail-at": "0", "bug-rank": 2, "bug-at": "1"})
    text = without_task_prefix(output(proc))
    assert proc.returncode != 0, text[-5000:]
    assert "ValueError: a bug in the training loop" in text, text[-5000:]
    starts = _starts(_events(gang))
    assert sorted(starts) == [0, 1], starts  # no restart after the bug
    for s in starts.values():
        # Nodes 0 and 1 as node ranks 0 and 1, both times: node 2 never trained.
        assert s["nodes"] == {0: {0}, 1: {1}} and s["rank0_node"] == 0 and s["world_size"] == {4}, starts
    assert starts[1]["resumed_from"] == {1}, starts
    assert "restarting every node's ranks (restart 1 of 2)" in text and "restart 2 of 2" not in text, text[-5000:]
    assert "taken out" not in text and "brought in" not in text, text[-5000:]
    assert not gang.reports("done-")
    _, tasks = _tasks(gang)
    roles = {n: t["record"].get("role") for n, t in tasks.items()}
    assert roles == {0: "active", 1: "active", 2: "spare"}, roles
    assert all(_bench(t["record"]) == ([2], []) for t in tasks.values()), tasks
    restarts = tasks[0]["record"]["in_step_restarts"]
    assert len(restarts) == 1 and restarts[0]["cause"].get("node_index") == 0, restarts
    assert restarts[0].get("swapped_out") is None and restarts[0].get("swapped_in") is None, restarts
    cause = tasks[0]["record"]["cause"]
    assert cause and cause.get("node_index") == 1 and "ValueError" in json.dumps(cause), cause
    # The bug under restarts=2 says why it was not restarted, on the failure screen and on the card.
    assert ("Not restarted: a Python exception of your code (ValueError" in text
            and "@torchrun(restarts=2) restarts only infrastructure failures" in text), text[-5000:]
    card = _control_card(gang)
    assert "Not restarted: a Python exception of your code" in card["markdown"][0], card["markdown"][0]
    assert card["topology"]["restarts"] == "1 used of 2 allowed", card["topology"]
    # The restart in place is on the card's timeline: the first start's killed rank 0 in the failure's
    # colour, then its second start, the bystanders of each stopped, and the restart's mark.
    ranks = [(b["lane"], b["state"], b["tip"]) for b in card["bars"] if b["lane"].startswith("rank")]
    rank0 = sorted((b["start"], b["state"], b["tip"]) for b in card["bars"] if b["lane"] == "rank 0 (node 0)")
    assert len(rank0) == 2 and rank0[0][1] == "rank: failed" and "start 0: failed (exit -9)" in rank0[0][2], ranks
    assert "start 1:" in rank0[1][2], ranks
    assert ("rank 1 (node 0)", "rank: stopped") in {(b["lane"], b["state"]) for b in card["bars"]}, ranks
    assert any(label.startswith("restart 1: rank 0 (node 0) failed") for label in card["marks"]), card["marks"]
    # The Ranks table says which start each row is.
    assert [r[2] for r in card["ranks"] if r[0] == "0"] == ["0 (replaced by restart 1)", "1 (the last)"], card["ranks"]
