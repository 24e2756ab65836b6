"""When the gang stops: where every rank was, hang_timeout, and a graceful stop
on SIGTERM. Real 2-node x 2-process local runs; the ``gang`` fixture fails a
test that leaves any process behind. Time bounds are the issue's promises or
generous hang guards; what a stop costs is measured in benchmarks/."""

import json
import os
import re
import signal
import socket
import time

import pytest
from our_processes import node_processes

from metaflow_extensions.torchrun.plugins.torchrun.host.basedir import LOGS, base_dir
from metaflow_extensions.torchrun.plugins.torchrun.procs.ranges import numbers

from .helpers import check_failure_screen, FLOWS, output
from .test_gang_failures import _attrs, _node_task

pytestmark = pytest.mark.integration

SCRIPTS = os.path.join(FLOWS, "scripts")


def _line_of(path, needle):
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if needle in line:
                return number
    raise AssertionError("%r not in %s" % (needle, path))


def _read_json(path):
    with open(path) as f:
        return json.load(f)


def _finish(proc, timeout=180):
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return out.decode(errors="replace")


def _control_record(gang, node=0, flow="GangFlow"):
    return gang.client(
        "run = Flow('%s').latest_run\n"
        "task = [t for t in run['train'] if 'torchrun-result' in t.metadata_dict "
        "and json.loads(t.metadata_dict['torchrun-result'])['node_index'] == %d][0]\n"
        "result = json.loads(task.metadata_dict['torchrun-result'])" % (flow, node)
    )


def test_a_rank_stuck_in_a_collective_shows_where_when_the_control_freezes(gang):
    """Also the test that the other nodes detect a frozen control at all."""
    gang.env.update(_attrs(heartbeat_timeout=5))
    proc = gang.start("--script", "stuck.py")
    frozen = []
    try:
        gang.wait_for_reports("ready-", 4, timeout=120)
        time.sleep(1)  # rank 2 is in its all-reduce by now
        control = _node_task(proc.pid, 0)
        node1 = _node_task(proc.pid, 1)
        spared = {node1, *node_processes(node1)}
        # Node 0 freezes: its task and its own ranks, not node 1 (its child here).
        frozen = [control] + [p for p in node_processes(control) if p not in spared]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(9)  # past heartbeat_timeout (5 s): node 1 has stopped its ranks
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
    text = _finish(proc)
    assert proc.returncode != 0
    stuck = _read_json(os.path.join(gang.out, "stuck.json"))["rank"]
    # Node 1's own failure, not the control's later report of the whole gang.
    start = text.index("node 1 stopped: heard nothing from the control node")
    block = text[start:].split("<flow ", 1)[0]
    line = _line_of(os.path.join(SCRIPTS, "stuck.py"), "dist.all_reduce(torch.zeros(1))")
    # The stuck rank alone at its place, so named alone (ranks at one place are grouped).
    assert re.search(r"rank %d: \S*stuck\.py:%d in <module>: dist\.all_reduce\(torch\.zeros\(1\)\)" % (stuck, line),
                     block), block
    # Below the user's frame, where the rank actually was: inside torch's collective
    # (the failure shows one line per place; node 1's record keeps the whole stack).
    assert "torch/distributed/" in _control_record(gang, node=1)["stacks"][str(stuck)]


# The two silent gangs' hang_timeout. Its clock runs from when every node reached the call, so the
# start of torchrun's agents and ranks counts: 0.5 s here under a load of 12. Two CI runs stopped
# this file's function gang before any rank started (10 s, then 20 s): it was its worker's first
# test, and the worker's warm process was still importing torch as every worker started;
# helpers.worker_warm now waits for that import before a worker's first run.
HANG = 20


def test_hang_timeout_stops_a_silent_gang_with_every_ranks_stack(gang):
    gang.env.update(_attrs(hang_timeout=HANG))
    proc = gang.start("--script", "silent.py")
    try:
        ready = gang.wait_for_reports("ready-", 4, timeout=120)
        last_line = max(os.path.getmtime(os.path.join(gang.out, "ready-%d.json" % r)) for r in ready)
    finally:
        text = _finish(proc)
    assert proc.returncode != 0
    assert "no output from any rank for %d s (hang_timeout=%ds)" % (HANG, HANG) in text, text[-4000:]
    check_failure_screen(text, "hang_timeout=%ds" % HANG, "silent.py")
    line = _line_of(os.path.join(SCRIPTS, "silent.py"), "time.sleep(3600)")
    # All four ranks at one place: one line names them.
    assert _ranks_at(text, r"\S*silent\.py:%d in <module>: time\.sleep\(3600\)" % line) == {0, 1, 2, 3}, text[-4000:]
    record = _control_record(gang)
    assert record["cause"]["kind"] == "hang"
    # The promise: stopped within hang_timeout + 5 s of the last line.
    assert record["cause"]["time"] - last_line <= HANG + 5, record["cause"]["time"] - last_line
    # The control's record holds every rank's full stack, from both nodes.
    assert sorted(record["stacks"]) == ["0", "1", "2", "3"]
    assert all("silent.py\", line %d" % line in s for s in record["stacks"].values())
    assert record["stack_seconds"] < 3


def _ranks_at(text: str, place: str) -> set:
    """Every rank some node's message puts at ``place``: ranks at one place are
    grouped (``rank 2: ...``, ``ranks 0-3 (4): ...``), and each node names its
    own ranks, the control every node's that reached it in time."""
    found = set()
    for m in re.finditer(r"ranks? ([0-9][0-9, -]*?)(?: \(\d+\))?: " + place, text):
        for piece in m.group(1).split(", "):
            low, _, high = piece.partition("-")
            found.update(range(int(low), int(high or low) + 1))
    return found


def _launch_logs(text: str, flow: str) -> str:
    """The tails of the run's logs beside the ranks' (torchrun's agents'), from its own directory
    (``logs/<flow>-<run id>/``, host/logs.py)."""
    run = re.search(r"\(run-id (\d+)\)", text)
    tails = []
    for top, _, names in os.walk(os.path.join(base_dir(), LOGS, "%s-%s" % (flow, run.group(1)))) if run else ():
        for name in sorted(n for n in names if n.endswith(".log") and not n.startswith("rank")):
            with open(os.path.join(top, name), errors="replace") as f:
                tails.append("\n--- %s ---\n%s" % (os.path.join(top, name), f.read()[-2000:]))
    return "".join(tails)


def test_a_function_entrypoints_stacks(gang):
    gang.env.update(_attrs(hang_timeout=HANG))
    gang.env["METAFLOW_TORCHRUN_DEBUG"] = "1"  # a failure below shows how the stop collected the stacks
    proc = gang.run("--mode", "hang", flow="function_flow.py", timeout=180)
    text = output(proc)
    assert proc.returncode != 0

    def shown() -> str:
        """Every debug line, and the agents' logs: a failure shows how far each node's start got
        (built only for a failure's message: it reads the run's logs)."""
        lines = text.splitlines()
        return ("\n".join(line for line in lines if " debug: " not in line)[-3000:] + "\n"
                + "\n".join(line for line in lines if " debug: " in line)[-12000:] + _launch_logs(text, "FunctionFlow"))

    assert "no output from any rank" in text, shown()
    line = _line_of(os.path.join(FLOWS, "fnlib.py"), "time.sleep(seconds)  # quiet here")
    assert _ranks_at(text, r"\S*fnlib\.py:%d in quiet_wait: time\.sleep\(seconds\)" % line) == {0, 1, 2, 3}, shown()
    # Each rank's main thread alone, its dump whole: the thread that answers for
    # the Flight Recorder at that moment is never walked (issue 50's SIGSEGV).
    dumps = _control_record(gang, flow="FunctionFlow")["stacks"]
    assert sorted(dumps) == ["0", "1", "2", "3"], dumps
    assert all(d.startswith("Stack (most recent call first):\n") and d.endswith(" in _run_module_as_main\n")
               and "flight_ask" not in d for d in dumps.values()), dumps


def test_sigterm_gives_the_ranks_time_to_save_a_checkpoint(gang):
    # A save that takes longer than a failure's short grace (3 s): only the
    # graceful stop (shutdown_grace, 30 s by default) lets it finish.
    gang.env["MFTR_SAVE_SECONDS"] = "5"
    proc = gang.start("--script", "checkpoint.py")
    try:
        gang.wait_for_reports("ready-", 4, timeout=120)
        tasks = [_node_task(proc.pid, 0), _node_task(proc.pid, 1)]
        told = time.monotonic()
        for pid in tasks:  # every node is told, as an AWS Batch job termination does
            os.kill(pid, signal.SIGTERM)
    finally:
        text = _finish(proc)
    assert proc.returncode != 0
    saved = gang.reports("ckpt-")
    assert sorted(saved) == [0, 1, 2, 3], text[-4000:]
    assert all(c["signal"] == signal.SIGTERM for c in saved.values())
    assert "was told to stop (SIGTERM" in text and "(shutdown_grace=30)" in text, text[-4000:]
    assert time.monotonic() - told < 60


@pytest.mark.parametrize("signal_used", ["stacks", "flight_recorder"])
def test_hang_timeout_names_the_rank_that_skipped_a_collective(gang, signal_used):
    """One rank skips an all_reduce the other three wait in (issue 39): it is
    named, with its node and host, before where the ranks were. ``stacks``:
    the Flight Recorder turned off by its knob, the others wait in
    ``all_reduce``. ``flight_recorder``: they wait on the work of an
    ``all_reduce(async_op=True)``, a wait no stack shows, and torch's
    Flight Recorder (on by default) names the rank."""
    gang.env.update(_attrs(hang_timeout=20))  # torchrun's agents import torch in silence first
    if signal_used == "stacks":
        gang.env["METAFLOW_TORCHRUN_FLIGHT_RECORDER"] = "off"
    else:
        gang.env["MFTR_ASYNC"] = "1"
    proc = gang.run("--script", "skip_collective.py", timeout=180)
    text = output(proc)
    assert proc.returncode != 0 and "hang_timeout=20s" in text, text[-4000:]
    assert os.path.exists(os.path.join(gang.out, "skipper.json")), text[-6000:]
    skipper = _read_json(os.path.join(gang.out, "skipper.json"))["rank"]
    others = sorted({0, 1, 2, 3} - {skipper})
    line = _line_of(os.path.join(SCRIPTS, "skip_collective.py"), "time.sleep(0.1)  # skipped")
    if signal_used == "stacks":
        head = "Suspected cause: rank %d is not in the all_reduce that ranks %s wait in (from the stacks):" % (
            skipper, numbers(others))
        said = ""
    else:
        # The script's barrier is the group's first collective (init_process_group's is the store's).
        head = ("Suspected cause: rank %d is not in the all_reduce #2 of process group 0 that ranks %s wait in "
                "(from torch's Flight Recorder):" % (skipper, numbers(others)))
        said = re.escape("its last was barrier #1 (completed); at ")
    if head not in text:  # what each rank's recorder said, for the one who reads the failure
        pytest.fail("%s\n%s" % (text[-4000:], json.dumps(_control_record(gang).get("culprits"), indent=1)))
    named = re.search(r"rank %d \(node 1, ([^)]+)\): %s\S*skip_collective\.py:%d in <module>" % (skipper, said, line),
                      text)
    assert named and named.group(1) == socket.gethostname(), text[-4000:]
    assert text.index(head) < text.index("Where the other ranks were", text.index(head)), text[-4000:]
    # Named as the suspected cause, never also as an echo of it; the gang stopped
    # the others: none of them failed as an echo of the hang.
    assert "as echoes of it" not in text, text[-4000:]
    record = _control_record(gang)
    assert record["cause"]["kind"] == "hang"
    culprits = record["culprits"]
    assert (culprits["signal"], culprits["collective"], culprits["waiting"]) == (signal_used, "all_reduce", others)
    assert [(s["rank"], s["node"]) for s in culprits["suspects"]] == [(skipper, 1)]