"""Real `flow.py run` of @torchrun flows: real Metaflow, real torch (CPU, gloo)."""

import os
import signal
import time

import pytest

from .calls import LIST_ARGS
from .helpers import output

pytestmark = pytest.mark.integration


def test_two_nodes_two_processes(calls_run):
    # The call "report" of calls.CALLS (report.py, 2 x 2), the run's last.
    gang = calls_run.gang
    assert calls_run.returncode == 0, calls_run.text[-4000:]
    reports = calls_run.reports("report", "rank-")
    assert sorted(reports) == [0, 1, 2, 3]
    for r, rep in reports.items():
        assert rep["rank"] == r and rep["world"] == 4
        assert rep["sum"] == 0 + 1 + 2 + 3
    # Each Metaflow node ran exactly two local ranks.
    by_node = {}
    for rep in reports.values():
        by_node.setdefault(rep["node_index"], set()).add(rep["local_rank"])
    assert by_node == {0: {0, 1}, 1: {0, 1}}
    indices = gang.client(
        "run = Flow('GangFlow').latest_run\nresult = run['join'].task['node_indices'].data"
    )
    assert indices == [0, 1]


def test_list_arguments_arrive_verbatim(calls_run):
    assert calls_run.returncode == 0, calls_run.text[-4000:]
    argvs = calls_run.reports("list", "argv-")
    assert sorted(argvs) == [0, 1]
    for argv in argvs.values():
        assert argv == LIST_ARGS
    assert not os.path.exists("/tmp/mftr-pwned")


def test_dict_arguments_become_flags(calls_run):
    assert calls_run.returncode == 0, calls_run.text[-4000:]
    argvs = calls_run.reports("dict", "argv-")
    assert sorted(argvs) == [0, 1]
    for argv in argvs.values():
        assert argv == ["--lr", "0.5", "--name", "a b $(x) `y`", "--verbose", "--layers", "1", "2", "3"]


def test_a_rank_raising_fails_the_step_and_names_it(failed_run):
    text = failed_run.text
    assert failed_run.proc.returncode != 0, text
    assert "ValueError: boom from rank 2" in text
    assert "rank 2" in text and "@torchrun job failed" in text
    # The user's traceback is there, pointing into their script.
    assert "in explode" in text


def test_megabytes_on_stderr_only_do_not_hang(calls_run):
    text = calls_run.text
    assert calls_run.returncode == 0, text[-3000:]
    assert calls_run.result("flood")["succeeded"]
    for r in range(4):
        assert "FLOOD-END rank %d" % r in text


def test_non_utf8_output_is_not_dropped(calls_run):
    assert calls_run.returncode == 0, calls_run.text[-3000:]
    shown = calls_run.text
    for r in range(4):
        # The readable text on both sides of the invalid bytes survives...
        assert "BIN-START rank %d" % r in shown and "BIN-END rank %d" % r in shown
    # ...and the invalid bytes themselves reach the task's persisted log.
    raw = b""
    for root, _, files in os.walk(calls_run.gang.tmp):
        for name in files:
            if "stdout" in name and name.endswith(".log"):
                with open(os.path.join(root, name), "rb") as f:
                    raw += f.read()
    assert raw.count(b"\xff\xfe\x80\xc3") == 4


def test_timeout_decorator_stops_everything(gang):
    start = time.monotonic()
    proc = gang.run(
        "--script", "spin.py", "--nproc", "1", top_args=("--with", "timeout:seconds=25"), timeout=180
    )
    text = output(proc)
    assert proc.returncode != 0, text
    assert "timed out" in text
    assert time.monotonic() - start < 150


def test_two_runs_at_once_on_one_host(gang, tmp_path_factory):
    from .helpers import Gang

    other = Gang(tmp_path_factory.mktemp("second"))
    # One process a node: what two runs share on a host is per node (ports, directories).
    a = gang.start("--nproc", "1")
    b = other.start("--nproc", "1")
    try:
        out_a, _ = a.communicate(timeout=240)
        out_b, _ = b.communicate(timeout=240)
    finally:
        for p in (a, b):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        other.kill_everything()
    assert a.returncode == 0, out_a.decode(errors="replace")[-3000:]
    assert b.returncode == 0, out_b.decode(errors="replace")[-3000:]
    for g in (gang, other):
        reports = g.reports("rank-")
        assert sorted(reports) == [0, 1]
        assert all(r["sum"] == 1 for r in reports.values())
