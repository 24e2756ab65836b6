"""exits.py and agent.record_worker_exits: a rank ended by a signal gets the exit
its agent reaped, with real torchelastic process contexts and real processes."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
from proc_helpers import wait_until

from metaflow_extensions.torchrun.plugins.torchrun.procs import agent, exits
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import STATUS_SUFFIX, rank_file
from metaflow_extensions.torchrun.plugins.torchrun.procs.status import read_statuses


def _status(directory, rank, **fields):
    path = rank_file(str(directory), rank, STATUS_SUFFIX)
    with open(path, "w") as f:
        json.dump(dict({"rank": rank, "local_rank": rank, "pid": 100 + rank, "start": 1.0, "end": None,
                        "exit_code": None}, **fields), f)
    return path


def _read(path):
    with open(path) as f:
        return json.load(f)


def test_only_ranks_without_an_exit_of_their_own_are_completed(tmp_path):
    stopped = _status(tmp_path, 0)
    finished = _status(tmp_path, 1, end=5.0, exit_code=0)
    other = _status(tmp_path, 2, pid=999)
    assert exits.complete(str(tmp_path), {100: -15, 101: -15}, when=9.0) == [0]
    assert (_read(stopped)["exit_code"], _read(stopped)["end"]) == (-15, 9.0)
    assert (_read(finished)["exit_code"], _read(finished)["end"]) == (0, 5.0)  # its own, kept
    assert _read(other)["exit_code"] is None  # not a pid the agent reaped
    assert oct(os.stat(stopped).st_mode & 0o777) == "0o600"


def test_a_status_file_is_never_followed_through_a_symlink(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"rank": 0, "pid": 100, "exit_code": None}))
    os.symlink(target, rank_file(str(tmp_path), 0, STATUS_SUFFIX))
    assert exits.complete(str(tmp_path), {100: -15}, when=9.0) == []
    assert json.loads(target.read_text())["exit_code"] is None


def test_no_directory_or_no_exits_changes_nothing(tmp_path):
    path = _status(tmp_path, 0)
    assert exits.complete(str(tmp_path), {}, 1.0) == [] and exits.complete(str(tmp_path / "gone"), {100: 1}, 1.0) == []
    assert _read(path)["exit_code"] is None


# A "rank": writes its status at its start as the bootstrap does, then waits.
RANK = (
    "import json, os, sys, time\n"
    "path = os.path.join(sys.argv[1], 'rank-%s.status.json' % sys.argv[2])\n"
    "json.dump({'rank': int(sys.argv[2]), 'local_rank': int(sys.argv[2]), 'pid': os.getpid(),\n"
    "           'start': time.time(), 'end': None, 'exit_code': None}, open(path, 'w'))\n"
    "time.sleep(600)\n"
)


def test_torch_closing_its_workers_records_their_exits(tmp_path, monkeypatch):
    """torchelastic's own process context, as the agent uses it: closing it
    (SIGTERM, what the agent does when the gang stops it) completes each
    worker's status with the exit torch reaped."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, api, start_processes

    monkeypatch.setattr(api.PContext, "close", api.PContext.close)  # the hook is undone after the test
    assert agent.record_worker_exits(str(tmp_path))
    assert not agent.record_worker_exits(str(tmp_path))  # once
    work = tmp_path / "work"
    work.mkdir()
    context = start_processes(
        name="ranks", entrypoint=sys.executable,
        args={r: ("-c", RANK, str(tmp_path), str(r)) for r in range(2)}, envs={0: {}, 1: {}},
        logs_specs=DefaultLogsSpecs(log_dir=str(work)))
    try:
        # Each status whole (the file exists before its JSON is written).
        assert wait_until(lambda: len(read_statuses(str(tmp_path))) == 2, timeout=30)
        began = time.time()
    finally:
        context.close()
    for r in range(2):
        status = _read(rank_file(str(tmp_path), r, STATUS_SUFFIX))
        assert status["exit_code"] == -15 and began <= status["end"] <= time.time(), status


def test_worker_exits_reads_what_torch_has_and_skips_the_rest():
    class Proc:
        def __init__(self, pid, code):
            self.pid, self.returncode, self.exitcode = pid, code, code

    class Handler:
        def __init__(self, proc):
            self.proc = proc

    class Context:
        subprocess_handlers = {0: Handler(Proc(7, -15)), 1: Handler(Proc(8, None)), 2: Handler(None)}

    assert agent.worker_exits(Context()) == {7: -15}
    assert agent.worker_exits(object()) == {}


@pytest.mark.parametrize("directory", [None, ""])
def test_no_work_directory_no_hook(directory):
    assert not agent.record_worker_exits(directory)


EXIT_NOW = r"""
import sys
from metaflow_extensions.torchrun.plugins.torchrun.procs import agent
log = open(sys.argv[1], "a")
log.write("in the log")  # buffered: exit_now flushes it
sys.stdout.write("on stdout")
agent.exit_now(int(sys.argv[2]), log, sys.argv[3])
raise SystemExit("not reached")
"""


@pytest.mark.parametrize("code", [0, 1])
def test_the_agent_exits_at_once_with_its_streams_flushed(tmp_path, code):
    """agent.exit_now: os._exit with the code, after flushing the agent log,
    stdout and the report on stderr (no interpreter teardown to wait for)."""
    import subprocess

    log = tmp_path / "agent.log"
    proc = subprocess.run([sys.executable, "-c", EXIT_NOW, str(log), str(code), "the report\n"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == code, proc.stderr
    assert proc.stdout == "on stdout"
    assert proc.stderr == "the report\n"
    assert log.read_text() == "in the log"
