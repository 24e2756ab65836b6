"""The node history across runs (record/node_history.py), with real local
flows and the local metadata: three runs in which node 1 (reporting the
host name "bad-host") dies make the history name that host, the fourth run's
preflight warns about it, and under preflight="strict" a fifth is refused
before any rank starts. The runs are shared by the module's tests (each costs
10-20 s); the ranks import no torch (tests/flows/scripts/node_dies.py)."""

import json
import os
import re
import subprocess

import pytest

from .helpers import Gang, output, without_task_prefix

# Five runs in the module's fixture, set up in its first test.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

HOSTS = {"METAFLOW_TORCHRUN_TEST_HOSTS": "good-host,bad-host"}
DIES = ("--script", "node_dies.py", "--script-args", '["--rank", "1"]', "--nproc", "1")
FINE = ("--script", "node_dies.py", "--script-args", '["--rank", "-1"]', "--nproc", "1")


@pytest.fixture(scope="module")
def history_gang(tmp_path_factory):
    gang = Gang(tmp_path_factory.mktemp("history"))
    try:
        failed = [gang.run(*DIES, env=HOSTS, timeout=300) for _ in range(3)]
        # A non-default threshold where it takes effect: 1 of the last 1 (the default is 2 of 5).
        warned = gang.run(*FINE, env=dict(HOSTS, METAFLOW_TORCHRUN_NODE_HISTORY="1/1"), timeout=300)
        refused = gang.run(*FINE, env=dict(HOSTS, MFTR_TORCHRUN_ATTRS='{"preflight": "strict"}'), timeout=300)
        yield gang, failed, warned, refused
    finally:
        leaked = gang.leaks()
        gang.kill_everything()
    assert not leaked, leaked


def _history(gang, *args):
    proc = subprocess.run(gang.command("gang_flow.py")[:-1] + ["torchrun", "history", *args], cwd=gang.tmp,
                          env=gang.env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_three_failures_of_one_host_make_the_history_name_it(history_gang):
    gang, failed, _, _ = history_gang
    assert all(p.returncode != 0 for p in failed), output(failed[0])[-3000:]
    # The five runs: three SIGKILLs on node 1, the warned run (a bystander), the refused one (a culprit again).
    report = json.loads(_history(gang, "--last", "5", "--json"))
    bad = report["hosts"][0]
    assert (bad["host"], bad["blamed"], bad["appearances"], bad["roles"]) == (
        "bad-host", 4, 5, {"culprit": 4, "bystander": 1}), report
    assert report["hosts"][1]["host"] == "good-host" and report["hosts"][1]["blamed"] == 0
    cause = report["causes"][0]
    assert cause["times"] == 3 and cause["hosts"] == ["bad-host"] and "SIGKILL" in cause["cause"], report
    # Each failed attempt kept its evidence bundle: the control's, and node 1's own (no nvidia-smi here).
    bundles = gang.client(
        "from metaflow_extensions.torchrun.plugins.torchrun.record import evidence\n"
        "run = list(Flow('GangFlow').runs())[-1]\n"
        "result = {t.id: evidence.read(t.pathspec) for t in run['train']}")
    control = [b for b in bundles.values() if b and "tails" in b][0]
    assert control["cause"]["node_index"] == 1 and control["attempt"] == 0, bundles
    assert "rank 0 up" in str(control["tails"]["ranks"]["0"]), control["tails"]
    assert [b for b in bundles.values() if b and b.get("node") == 1 and "nvidia_smi" in b], bundles
    table = _history(gang, "--last", "20")
    assert "bad-host" in table and "causes that recurred" in table
    # From Python, by the import path docs/resume.md gives: the same report.
    same = gang.client("from metaflow_extensions.torchrun.history import history\n"
                       "result = history('GangFlow', last=5)")
    assert same == report


def test_the_fourth_run_warns_naming_the_evidence(history_gang):
    _, _, warned, _ = history_gang
    text = output(warned)
    assert warned.returncode == 0, text[-4000:]
    assert ("preflight: node 1: bad-host was blamed in 1 of its last 1 appearances" in text), text[-4000:]
    assert 'preflight="strict" would' in text


def test_strict_refuses_the_node_before_any_rank_starts(history_gang):
    gang, _, _, refused = history_gang
    text = output(refused)
    assert refused.returncode != 0
    assert ("preflight refused the gang before any rank started: node 1: bad-host was blamed in 3 of its last 4 "
            "appearances" in text), text[-4000:]
    assert "rank 0 up" not in text and "rank 1 up" not in text
    # The history counts the refusal too: the host was the culprit again.
    report = json.loads(_history(gang, "--last", "1", "--json"))
    assert report["hosts"][0]["host"] == "bad-host" and report["hosts"][0]["blamed"] == 1, report


# -- a local run: every node on one machine (no METAFLOW_TORCHRUN_TEST_HOSTS) ----------------
# Three Metaflow nodes of one rank each, node 2 a hot spare; restart_resume.py's "bad GPU" on node 1
# SIGKILLs its rank every time it starts there. Each run swaps node 1 out for the spare and succeeds.
SPARE_RUN = ("--script", "restart_resume.py", "--nodes", "3", "--nproc", "1",
             "--script-args", json.dumps({"fail-at": "", "steps": 2, "bad-node": 1}))
SPARES = {"MFTR_TORCHRUN_ATTRS": json.dumps({"restarts": 1, "spares": 1})}
# The history's lines on the preflight, each naming the nodes it flags.
FLAGGED = re.compile(r"@torchrun: preflight: nodes? ([\d, ]+): .* was blamed in \d+ of its last \d+ appearances")


def _flagged(text):
    return sorted({int(n) for line in FLAGGED.findall(text) for n in line.split(",")})


def _fresh_run(gang, i, args, env):
    """A run whose script starts from no checkpoint (restart_resume.py resumes from its out folder's)."""
    out = os.path.join(gang.out, "run-%d" % i)
    os.makedirs(out)
    return gang.run(*args, env=dict(env, MFTR_TEST_OUT=out), timeout=300)


@pytest.fixture(scope="module")
def local_spares(tmp_path_factory):
    gang = Gang(tmp_path_factory.mktemp("local-spares"))
    try:
        yield gang, [_fresh_run(gang, i, SPARE_RUN, SPARES) for i in range(3)]
    finally:
        leaked = gang.leaks()
        gang.kill_everything()
    assert not leaked, leaked


def test_a_local_runs_history_neither_warns_nor_reorders_its_gang(local_spares):
    """Every node shares this machine's host name, so the history cannot tell which machine node 1 was:
    node 1's two swaps are in `torchrun history`, and the third run's gang is as the user wrote it (was: a
    long warning, and node 1 silently the spare, said after training had begun)."""
    gang, runs = local_spares
    for proc in runs:
        assert proc.returncode == 0, output(proc)[-4000:]
    texts = [without_task_prefix(output(p)) for p in runs]
    for text in texts:
        assert "call 1: node 1 (" in text and ") taken out, spare node 2 (" in text, text[-4000:]
        assert _flagged(text) == [] and "starts as a spare" not in text and "was blamed in" not in text, text[-4000:]
    report = json.loads(_history(gang, "--last", "3", "--json"))
    blamed = {h["host"]: h["blamed"] for h in report["hosts"]}
    assert sorted(v for v in blamed.values() if v) == [3], report  # node 1's three swaps, nobody else's
    assert [h for h, v in blamed.items() if v][0].endswith("(node 1)"), report


# One run of two nodes, no spare: rank 1 (node 1) is SIGKILLed in the first start, the ranks restart
# in place and the run succeeds.
RESTART_RUN = ("--script", "restart_resume.py", "--nodes", "2", "--nproc", "1",
               "--script-args", json.dumps({"fail-at": "0", "fail-rank": 1, "steps": 2}))


def test_a_restart_in_place_blames_the_node_that_failed(tmp_path_factory):
    gang = Gang(tmp_path_factory.mktemp("restart-in-place"))
    try:
        proc = _fresh_run(gang, 0, RESTART_RUN, {"MFTR_TORCHRUN_ATTRS": json.dumps({"restarts": 1})})
        text = without_task_prefix(output(proc))
        assert proc.returncode == 0 and "restarting every node's ranks (restart 1 of 1)" in text, text[-4000:]
        report = json.loads(_history(gang, "--last", "1", "--json"))
    finally:
        leaked = gang.leaks()
        gang.kill_everything()
    assert not leaked, leaked
    hosts = {h["host"]: h for h in report["hosts"]}
    culprit = [h for h in hosts.values() if h["blamed"]]
    assert len(culprit) == 1 and culprit[0]["host"].endswith("(node 1)"), report
    assert culprit[0]["roles"] == {"culprit": 1}, report
    assert "restarted in place" in report["causes"][0]["cause"] and "SIGKILL" in report["causes"][0]["cause"], report
    assert all(h["blamed"] == 0 for h in hosts.values() if not h["host"].endswith("(node 1)")), report
