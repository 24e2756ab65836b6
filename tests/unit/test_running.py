"""procs/running.py: the ranks ``python flow.py torchrun ps`` lists, read from a
work directory as a call leaves it, with real processes standing for the
Metaflow task (its command line) and the ranks (their pids and start times)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.procs.running import running_ranks
from metaflow_extensions.torchrun.plugins.torchrun.procs.status import RankStatus
from metaflow_extensions.torchrun.plugins.torchrun.procs.status import write_status
from metaflow_extensions.torchrun.plugins.torchrun.cli import ps_table


def _sleeper(*args: str, cwd: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *args], cwd=cwd)


@pytest.fixture
def call(tmp_path):
    """A task of flow.py (step train, run 7, task 3) whose call has four
    ranks' status files: one running, one ended, one whose pid a later process
    took, one whose process is gone."""
    flow = tmp_path / "flow.py"
    flow.write_text("")
    base = tmp_path / "base"
    base.mkdir(mode=0o700)
    task = _sleeper("flow.py", "--quiet", "step", "train", "--run-id", "7", "--task-id", "3", cwd=str(tmp_path))
    rank0 = _sleeper(cwd=str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    time.sleep(0.1)
    work = base / "work" / ("%d-abc" % task.pid)
    work.mkdir(parents=True, mode=0o700)
    now = time.time()
    write_status(str(work), RankStatus(rank=0, local_rank=0, group_rank=1, pid=rank0.pid, start=now))
    write_status(str(work), RankStatus(rank=1, local_rank=1, group_rank=1, pid=rank0.pid, start=now, end=now,
                                       exit_code=0))
    write_status(str(work), RankStatus(rank=2, local_rank=2, group_rank=1, pid=task.pid, start=now - 3600))
    write_status(str(work), RankStatus(rank=3, local_rank=3, group_rank=1, pid=gone.pid, start=now))
    (base / "work" / "not-a-call").mkdir()
    try:
        yield str(flow), str(base), rank0.pid
    finally:
        for p in (task, rank0):
            p.kill()
            p.wait()


def test_the_running_rank_of_the_flow_is_listed_with_its_command(call):
    flow, base, pid = call
    ranks = running_ranks(flow, base)
    assert [(r.run_id, r.step, r.task_id, r.node, r.rank, r.local_rank, r.pid) for r in ranks] == [
        ("7", "train", "3", 1, 0, 0, pid)]
    assert ranks[0].command == "%s -c import time; time.sleep(120)" % sys.executable
    assert running_ranks(None, base) == ranks


def test_another_flow_file_lists_nothing(call, tmp_path):
    _, base, _ = call
    other = tmp_path / "other.py"
    other.write_text("")
    assert running_ranks(str(other), base) == []


def test_the_table_has_a_head_and_a_row_per_rank(call):
    flow, base, pid = call
    lines = ps_table(running_ranks(flow, base))
    assert lines[0].split() == ["run", "step", "node", "rank", "pid", "command"]
    assert lines[1].split()[:5] == ["7", "train", "1", "0", str(pid)]
    assert len(lines) == 2
    assert os.path.basename(sys.executable) in lines[1]
