"""Where each rank's output lives, and how long its files stay (issue 28, item 4),
with real flows.

"`python flow.py logs <run>/train/2_node_1` is empty locally; node 1's ranks are
in the control's log. This is not documented." and "a run's files were gone an
hour later while other flows ran". Each test runs with its own TMPDIR, so the
per-rank files of other tests (and engineers) on this host are never touched."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from .helpers import FLOWS, output

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

HOUR = 3600
WHERE = re.compile(r"@torchrun: this step's per-rank log files on this host \(kept at least (\S+) h, "
                   r"less if all logs here pass (\S+) MB\): (\S+)")
RUN_ID = re.compile(r"Workflow starting \(run-id (\S+)\)")
CONTROL = re.compile(r"\[(\S+)/train/(\d+) \(pid")
RANKS = {0: (0, 1), 1: (2, 3)}  # 2 nodes x 2 processes


def _age(path, seconds):
    then = time.time() - seconds
    os.utime(path, (then, then))


def _plant(logs, name, hours_ago, size=100):
    """Another flow's run on this host, as @torchrun lays its files out."""
    node = os.path.join(logs, name, "train-2-0", "c0", "node-0")
    os.makedirs(node, mode=0o700)
    with open(os.path.join(node, "rank-0.stdout.log"), "wb") as f:
        f.write(b"x" * size)
    _age(os.path.join(logs, name), hours_ago * HOUR)
    return os.path.join(logs, name)


def _sandbox(tmp_path):
    tmp = str(tmp_path / "tmp")
    os.makedirs(tmp)
    return tmp, os.path.join(tmp, "metaflow-torchrun-%d" % os.geteuid(), "logs")


def _logs_command(gang, pathspec):
    return subprocess.run(
        [sys.executable, os.path.join(FLOWS, "gang_flow.py"), "--no-pylint", "logs", pathspec],
        cwd=gang.tmp, env=gang.env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def test_a_runs_files_outlive_other_flows_runs_and_the_control_says_where(gang, tmp_path):
    tmp, logs = _sandbox(tmp_path)
    env = {"TMPDIR": tmp, "METAFLOW_TORCHRUN_KEEP_LOGS": "1"}
    a = gang.run("--script", "speak.py", env=env)
    text = output(a)
    assert a.returncode == 0, text[-3000:]

    # The control said where every rank's files are, once, and they are there.
    where = WHERE.findall(text)
    assert len(where) == 1, text[-3000:]
    hours, _mb, step_dir = where[0]
    assert hours == "72" and step_dir.startswith(logs + os.sep)
    for node, ranks in RANKS.items():
        for rank in ranks:
            for stream in ("stdout", "stderr"):
                with open(os.path.join(step_dir, "c0", "node-%d" % node, "rank-%d.%s.log" % (rank, stream))) as f:
                    assert "%s of rank %d" % (stream, rank) in f.read()

    # Locally every node's ranks are in the control task's log; the worker's is empty.
    run_id, control = RUN_ID.search(text).group(1), CONTROL.search(text).group(2)
    control_log = _logs_command(gang, "%s/train/%s" % (run_id, control))
    assert control_log.returncode == 0, control_log.stderr
    for rank in range(4):
        assert "[rank%d]: stdout of rank %d" % (rank, rank) in control_log.stdout
        assert "[rank%d]: stderr of rank %d" % (rank, rank) in control_log.stdout + control_log.stderr
    worker_log = _logs_command(gang, "%s/train/%s_node_1" % (run_id, control))
    assert worker_log.returncode == 0, worker_log.stderr
    assert "[rank" not in worker_log.stdout + worker_log.stderr

    # An hour later, 30 other flows' runs on the host since, and 3 runs days old.
    run_a = os.path.join(logs, os.path.relpath(step_dir, logs).split(os.sep)[0])
    _age(run_a, HOUR)
    others = [_plant(logs, "Other%d-%d" % (i, i), hours_ago=(i + 1) * 0.05 + (i % 3) * 20) for i in range(30)]
    stale = [_plant(logs, "Stale%d-%d" % (i, i), hours_ago=100 + i) for i in range(3)]
    b = gang.run("--script", "speak.py", env=env)
    assert b.returncode == 0, output(b)[-3000:]

    for node, ranks in RANKS.items():  # every file of run A is still there
        for rank in ranks:
            for stream in ("stdout", "stderr"):
                assert os.path.isfile(os.path.join(step_dir, "c0", "node-%d" % node, "rank-%d.%s.log" % (rank, stream)))
    assert all(os.path.isdir(p) for p in others), "runs within the age are kept, however many"
    assert not any(os.path.exists(p) for p in stale), "older than the age and beyond the newest run: gone"
    assert os.path.isdir(WHERE.search(output(b)).group(3))
    assert not gang.leaks()


def test_space_takes_the_least_recently_used_runs_first_and_says_so(gang, tmp_path):
    tmp, logs = _sandbox(tmp_path)
    older = _plant(logs, "Older-1", hours_ago=5, size=600 * 1024)
    recent = _plant(logs, "Recent-1", hours_ago=2, size=600 * 1024)
    newest = _plant(logs, "Newest-1", hours_ago=1, size=100 * 1024)
    proc = gang.run("--script", "speak.py", env={"TMPDIR": tmp, "METAFLOW_TORCHRUN_MAX_LOG_MB": "1"})
    text = output(proc)
    assert proc.returncode == 0, text[-3000:]
    said = [line for line in text.splitlines() if "passed METAFLOW_TORCHRUN_MAX_LOG_MB" in line]
    assert len(said) == 1, said  # one line, from the first node to prune
    assert said[0].endswith("@torchrun: the per-rank logs on this host passed METAFLOW_TORCHRUN_MAX_LOG_MB=1: "
                            "removed those of 1 run used in the last 72 h (least recently used first): Older-1")
    assert not os.path.exists(older) and os.path.isdir(recent) and os.path.isdir(newest)
    step_dir = WHERE.search(text).group(3)  # this run's own files, made while the bound held
    assert os.path.isfile(os.path.join(step_dir, "c0", "node-1", "rank-3.stdout.log"))
