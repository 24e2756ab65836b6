"""One failure stops the whole gang fast, with the root cause; restarts and retries.

Each test injects one failure into a real 2-node x 2-process local run and checks
that the run ends (long before any gloo timeout, which is 30 minutes), that the
error names the root cause, and (through the ``gang`` fixture) that no process
survives. Time bounds here are generous hang guards; latency is measured in
benchmarks/.
"""

import json
import os
import re
import select
import signal
import time

import pytest
from our_processes import node_processes, node_tasks

from .helpers import check_failure_screen, output, without_task_prefix

pytestmark = pytest.mark.integration

HANG_GUARD = 90  # seconds; the failure modes under test would otherwise hang 30 min


def _attrs(**kw):
    return {"MFTR_TORCHRUN_ATTRS": json.dumps(kw)}


def _node_task(run_pid, node_index):
    """The local Metaflow task process of one node."""
    tasks = node_tasks(run_pid, control=node_index == 0)
    if tasks:
        return tasks[0]
    raise AssertionError("no task process for node %d" % node_index)


def _run_and_inject(gang, inject, *args, env=None, timeout=240):
    """Start a run of one process a node (what fails here is a node), wait
    until both ranks are ready, inject, wait for the end. ``inject`` returns
    what it read of the run's output, if it read any."""
    if env:
        gang.env.update(env)
    proc = gang.start("--script", "spin.py", "--nproc", "1", *args)
    try:
        gang.wait_for_reports("ready-", 2, timeout=120)
        injected_at = time.monotonic()
        before = inject(proc) or b""
        out, _ = proc.communicate(timeout=timeout)
        out = before + out
        ended_after = time.monotonic() - injected_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out.decode(errors="replace"), ended_after


def test_rank_raising_names_node_rank_and_traceback_once(failed_run):
    text = failed_run.text
    assert failed_run.proc.returncode != 0
    # Rank 2 is on node 1: its error has the traceback, once, in the user's
    # frames; the control's says where the logs are.
    screen = check_failure_screen(
        text, "First failure: node 1 (", "rank 2", "in explode", "ValueError: boom from rank 2",
        "node 0 stopped because node 1 failed first", "Every rank's output, whole: ",
        once='raise ValueError("boom from rank %d" % r)')
    # torchrun's own chatter waits in the node's agent log, not on the console:
    # its ChildFailedError box, the SignalException of an agent we stopped, its W/E lines.
    for noise in ("ChildFailedError", "SignalException", "closing signal SIGTERM", "torch/distributed/elastic"):
        assert noise not in text, noise
    logs = re.search(r"Every rank's output, whole: (\S+)", "\n".join(screen)).group(1)
    agent_logs = [os.path.join(top, name) for top, _, names in os.walk(logs) for name in names if "agent" in name]
    assert any("ChildFailedError" in open(path).read() for path in agent_logs), agent_logs  # kept there


def test_rank_segfault_is_named_with_its_signal(gang):
    proc = gang.run("--script", "segfault.py", "--script-args", json.dumps({"rank": 1}), timeout=180)
    text = output(proc)
    assert proc.returncode != 0
    # The rank left no traceback: the error carries its last stderr (faulthandler's
    # dump, from the rank's log: not on the console a second time), which says where it crashed.
    screen = check_failure_screen(text, "First failure: node 0 (", "SIGSEGV", "The rank's last lines of stderr:",
                                  "Fatal Python error: Segmentation fault", once="Fatal Python error")
    shown = "\n".join(screen)
    assert re.search(r'File ".*segfault\.py", line 19 in <module>', shown), shown
    assert "node 1 stopped because node 0 failed first (its error in this log has the rank's last lines of stderr)" in shown


def _read_until(proc, needle: bytes, timeout: float) -> bytes:
    """``proc``'s output until ``needle`` is in it, or a failure showing what came instead."""
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
            raise AssertionError("no %r on the console in %ds; it printed:\n%s" % (needle, timeout, seen[-3000:]))
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            raise AssertionError("the run ended without %r:\n%s" % (needle, seen[-3000:]))
        seen += chunk
    return seen


# spin.py's last words, a line it has not ended: the console shows it while its rank runs (issue 83).
LAST_WORDS = b"[rank1]: rank 1: all-reduce under way..."


def test_node_task_sigkilled_stops_the_gang(gang):
    """Once node 1's rank has said its last words (a line without its newline), its task is killed:
    the words are on the console, once, not only in the rank's log (held for a newline, they went to
    the console through the task that was gone)."""
    def kill_once_said(p):
        said = _read_until(p, LAST_WORDS, timeout=60)
        os.kill(_node_task(p.pid, 1), signal.SIGKILL)
        return said

    code, text, took = _run_and_inject(gang, kill_once_said)
    assert code != 0
    assert took < HANG_GUARD
    assert "node 1" in text and "disconnected before its step ended" in text, text[-4000:]
    check_failure_screen(text, "disconnected before its step ended")
    assert without_task_prefix(text).count(LAST_WORDS.decode()) == 1, text[-4000:]


def test_frozen_node_is_detected_by_heartbeat(gang):
    def freeze(p):
        task = _node_task(p.pid, 1)
        for pid in [task] + node_processes(task):
            os.kill(pid, signal.SIGSTOP)

    code, text, took = _run_and_inject(gang, freeze, env=_attrs(heartbeat_timeout=6))
    assert code != 0
    assert took < 6 + HANG_GUARD
    # Two nodes: node 1 was node 0's only peer, so from node 0's side a frozen
    # node and a cut link look the same; both are named, node 1 as the silent one.
    assert "lost contact between node 0 (the control, " in text, text[-4000:]
    assert re.search(r"no heartbeat from node 1 for \d+s \(heartbeat_timeout=6s\)", text), text[-4000:]
    assert "node 1 is frozen" in text, text[-4000:]
    check_failure_screen(text, "no heartbeat from node 1")


def test_max_restarts_recovers_across_nodes(gang):
    proc = gang.run(
        "--script", "fail_once.py", "--script-args", json.dumps({"mode": "restart"}), "--nproc", "1",
        "--torchrun-args", json.dumps({"max_restarts": 1}), timeout=240,
    )
    text = output(proc)
    assert proc.returncode == 0, text[-4000:]
    reports = gang.reports("rank-")
    assert sorted(reports) == [0, 1]  # rank 1 is node 1's: the restart crosses nodes
    assert all(r["sum"] == 2 for r in reports.values())
    # Rank 1 fails while its restart count is 0, so it ran again after a restart.
    # (A node whose own workers were healthy restarts them for the new round
    # without counting it: torch counts only a node's own failures.)
    assert reports[1]["restarts"] >= 1
    assert "first try fails" in text


def test_retry_reruns_the_whole_gang(gang):
    proc = gang.run(
        "--script", "fail_once.py", "--script-args", json.dumps({"mode": "retry"}), "--nproc", "1",
        top_args=("--with", "retry:times=1,minutes_between_retries=0"), timeout=300,
    )
    text = output(proc)
    assert proc.returncode == 0, text[-4000:]
    assert "first attempt fails" in text
    reports = gang.reports("rank-")
    assert sorted(reports) == [0, 1]
    assert all(r["sum"] == 2 for r in reports.values())
    attempts = gang.client(
        "t = Flow('GangFlow').latest_run['train'].task\n"
        "result = t.current_attempt"
    )
    assert attempts == 1
