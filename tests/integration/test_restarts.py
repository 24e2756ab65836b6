"""@torchrun(restarts=N): the gang restarts a call's ranks on every node, in
the same tasks, after a failure that left every task alive; never after a
Python exception in the user's code. Real local flows (CPU, gloo): 2 x 2, and
2 x 1 where a rank's count does not matter to what is checked."""

import json
import os
import subprocess

from .helpers import finish_or_explain, output

SCRIPT = "restart_resume.py"
# Under pytest's own 300 s: a run that does not end fails with what it printed
# and where each of its processes waits, not with pytest's bare timeout.
FLOW_TIMEOUT = 240


def _run(gang, restarts, env=None, nproc=2, **script_args):
    gang.env.update(env or {}, MFTR_TORCHRUN_ATTRS=json.dumps({"restarts": restarts}))
    proc = gang.start("--script", SCRIPT, "--script-args", json.dumps(script_args), "--nproc", str(nproc))
    out = finish_or_explain(proc, gang, FLOW_TIMEOUT)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, b"")


def _events(gang):
    with open(os.path.join(gang.out, "events.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _record(gang):
    return gang.client(
        "r = Flow('GangFlow').latest_run\n"
        "tasks = [t for t in r['train'] if t.id.isdigit()]\n"
        "result = {'attempts': sorted(t.current_attempt for t in tasks), 'ids': sorted(t.id for t in tasks),\n"
        "          'record': [json.loads(t.metadata_dict['torchrun-result']) for t in tasks\n"
        "                     if 'torchrun-result' in t.metadata_dict]}")


def test_a_rank_killed_twice_restarts_twice_in_the_same_tasks_and_resumes(gang):
    # Rank 2, beside the failing rank 3 on node 1, is late to its save each time (a loaded machine
    # can deschedule it there): every rank still resumes from the step they all saved.
    proc = _run(gang, 2, **{"fail-at": "0,1", "steps": 3, "slow-save": 2})
    text = output(proc)
    assert proc.returncode == 0, text[-5000:]
    events = _events(gang)
    # Three starts of four ranks each: the first, then restarts 1 and 2.
    assert sorted((e["restart"], e["rank"]) for e in events) == [(k, r) for k in range(3) for r in range(4)], events
    # Rank 0 on node 0, ranks in node order, after every restart.
    assert all(e["node"] == e["group_rank"] == e["rank"] // 2 for e in events), events
    # Every start's ranks were forked from their node's warm process, torch already imported:
    # the control's forked from the run's (Metaflow's runtime's), node 1's from the control's.
    assert all(e["warm"] and e["host_forked"] for e in events), events
    control_warm = {e["parent"] for e in events if e["node"] == 0}
    assert len(control_warm) == 1 and {e["task_pid"] for e in events if e["node"] == 1} == control_warm, events
    # The same two Metaflow tasks (one process each) ran every start.
    for node in (0, 1):
        assert len({e["task_pid"] for e in events if e["node"] == node}) == 1, events
    # Each restart resumed from the rank's own checkpoint: step 1, then step 2.
    assert {e["resumed_from"] for e in events if e["restart"] == 1} == {1}, events
    assert {e["resumed_from"] for e in events if e["restart"] == 2} == {2}, events
    assert len(gang.reports("done-")) == 4
    assert "restarting every node's ranks (restart 1 of 2)" in text, text[-5000:]
    assert "restart 2 of 2" in text
    found = _record(gang)
    assert found["attempts"] and set(found["attempts"]) == {0}, found  # no @retry attempt: the same tasks
    record = found["record"][0]
    restarts = record["in_step_restarts"]
    assert [r["restart"] for r in restarts] == [1, 2], restarts
    assert all(r["kind"] == "failed" and "SIGKILL" in r["stopped"] for r in restarts), restarts
    assert all(r["restart_seconds"] > 0 and r["lost_work_seconds"] >= 0 for r in restarts), restarts
    assert record["restarts"] == 2 and record["cause"] is None


def test_a_bug_in_the_users_code_is_not_restarted(gang):
    # And with the warm process switched off, every rank starts fresh: its own import of torch.
    # One rank a node (2 x 1, rank 1 on node 1 raises): each rank's own import of torch costs ~1.6 CPU-s.
    proc = _run(gang, 2, env={"METAFLOW_TORCHRUN_WARM_START": "0"}, nproc=1,
                **{"fail-at": "0", "steps": 2, "bug": True, "fail-rank": 1})
    text = output(proc)
    assert proc.returncode != 0
    assert "ValueError: a bug in the training loop" in text, text[-5000:]
    assert "restarting" not in text, text[-5000:]
    # Why not, in the words retry_on uses (a screen that showed the ValueError alone read as if no
    # restart had been asked for).
    assert "Not restarted: a Python exception of your code (ValueError" in text, text[-5000:]
    events = _events(gang)
    assert {e["restart"] for e in events} == {0} and len(events) == 2, events
    assert not any(e["warm"] or e["host_forked"] for e in events), events
