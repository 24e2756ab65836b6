"""Every way a worker goes, and the step goes on where it can (gang/recovery.py): a node frozen whole (SIGSTOP of
its task and everything below it: no socket closes, as with a kernel panic or a host pulled from the network),
a worker's task SIGTERMed (a pod evicted, a node drained), a worker's spot termination notice (the file
Metaflow's monitor writes). With a spare, it is swapped out; with min_nodes=2 and no spare, the gang trains
on without it. The frozen node's processes are killed by the local control, which starts its task again: it
comes back as a spare (the gang grows back at a snapshot with min_nodes). A node told to go stops its ranks
with the grace, and its task ends fine, alone, while the others train on. Each run ends with the step and its
join succeeding and nothing left running (the sandbox's check).

Four real flows of 3 nodes x 2 processes on gloo (tests/flows/lost_node_flow.py, snapshot_train.py: DDP with a
snapshot every step), two facts in each of the longer ones: a frozen node, then, once it is back, another told
to go. (A node's connection closed: test_lost_nodes.py.)"""

import datetime
import json
import os
import re
import signal
import threading
import time

import pytest
from our_processes import node_processes

from .helpers import finish_or_explain, without_task_prefix
from .test_lost_nodes import _JOIN, _history_of, _starts, _task_of

pytestmark = pytest.mark.integration

FLOW = "lost_node_flow.py"
FLOW_TIMEOUT = 300
HEARTBEAT_TIMEOUT = 5
# Long enough that both facts of a run happen mid-training: 240 steps of at least 0.2 s.
SCRIPT_ARGS = ["--steps", "240", "--mb", "2", "--step-sleep", "0.2", "--mark-steps"]
SHORT_ARGS = ["--steps", "60", "--mb", "2", "--step-sleep", "0.2", "--mark-steps"]
WAIT = 180.0


class Console:
    """The run's console, read as it comes, so a test can wait for what the control says."""

    def __init__(self, proc):
        self.proc = proc
        self.chunks = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        for line in iter(self.proc.stdout.readline, b""):
            self.chunks.append(line)

    @property
    def text(self):
        return without_task_prefix(b"".join(self.chunks).decode(errors="replace"))

    def wait_for(self, pattern, timeout=WAIT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, self.text):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError("never said %r:\n%s" % (pattern, self.text[-5000:]))

    def finish(self, gang):
        try:
            self.proc.wait(timeout=FLOW_TIMEOUT)
        except Exception:
            finish_or_explain(self.proc, gang, 1)  # says what is still alive, and where it waits
        self._thread.join(timeout=10)
        return self.text


def _start(gang, attrs, script_args=SCRIPT_ARGS):
    gang.env["MFTR_TORCHRUN_ATTRS"] = json.dumps(dict(attrs, heartbeat_timeout=HEARTBEAT_TIMEOUT))
    gang.env["MFTR_SPOT_NOTICES"] = notices = os.path.join(gang.tmp, "notices")
    os.makedirs(notices, exist_ok=True)
    proc = gang.start("--nodes", "3", "--script-args", json.dumps(script_args), flow=FLOW)
    return proc, Console(proc)


def _freeze(run_pid, node):
    """The node's task and every process below it stopped at once (its warm process's too): no socket closes."""
    task = _task_of(run_pid, node)
    frozen = [task] + node_processes(task)
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    return frozen


def _notice(gang, node, seconds=120):
    """What Metaflow's monitor writes: the termination time, ISO 8601 (an empty file is none yet)."""
    when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)
    path = os.path.join(gang.tmp, "notices", "node-%d" % node)
    with open(path + ".tmp", "w") as f:
        f.write(when.strftime("%Y-%m-%dT%H:%M:%SZ"))
    os.replace(path + ".tmp", path)


def _gone(pids):
    """None of ``pids`` is alive, stopped or running (a zombie is gone: only its parent's reap is left)."""
    alive = []
    for pid in pids:
        try:
            with open("/proc/%d/stat" % pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            alive.append((pid, state))
    return alive


def _wait_starts(gang, console, start, ranks, timeout=WAIT):
    """Every rank of ``start`` (the restart's count) began: what it resumed from, per rank."""
    return _until(console, lambda: _starts(gang, start) if len(_starts(gang, start)) >= ranks else None,
                  "start %d's %d ranks" % (start, ranks), timeout)


def _wait_for_step(gang, console, ranks, step, timeout=WAIT):
    """``ranks`` ranks of the first start did ``step``."""
    def done():
        at = gang.reports("at-rank-")
        return len(at) >= ranks and all(r["step"] >= step for r in at.values())

    _until(console, done, "%d ranks at step %d" % (ranks, step), timeout)


def _until(console, found, what, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and console.proc.poll() is None:
        got = found()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError("no %s (the run %s):\n%s" % (what, "ended" if console.proc.poll() is not None
                                                       else "runs on", console.text[-5000:]))


def _ended_alone(console, task, timeout=WAIT):
    """The departing node's task (``task``) ends while the rest of the run goes on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _gone([task]):
        time.sleep(0.1)
    assert not _gone([task]), "the departing task still runs:\n%s" % console.text[-3000:]
    assert console.proc.poll() is None, "the run ended with it"


def _joined(gang):
    joined = gang.client(_JOIN)
    assert joined["successful"] and joined["count"] == 3 and joined["dataset"] == "toy", joined
    assert joined["tasks"] == [[0, True], [1, True], [2, True]], joined
    return joined


def _on_nodes(start):
    return sorted({s["node"] for s in start.values()})


def test_with_a_spare_a_frozen_node_is_swapped_out_and_back_then_a_spot_notice_swaps_another(gang):
    proc, console = _start(gang, {"restarts": 3, "spares": 1})
    try:
        _wait_for_step(gang, console, 4, 3)
        frozen = _freeze(proc.pid, 1)
        console.wait_for(r"call 1: node 1 \([^)]*\) taken out, spare node 2 \([^)]*\) brought in \(restart 1 of 3\): "
                         r"node 1 \([^)]*\) sent no heartbeat for \d+s \(heartbeat_timeout=5s\): frozen or cut off")
        first = _wait_starts(gang, console, 1, 4)
        assert _gone(frozen) == [], _gone(frozen)  # killed by the control, SIGSTOPped ones included
        console.wait_for(r"node 1 \([^)]*\) is back after it was lost: a spare now")
        _notice(gang, 2)
        second = _wait_starts(gang, console, 2, 4)
        text = console.finish(gang)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, text[-5000:]
    assert "node 1 was silent past heartbeat_timeout and the gang went on without it: its task and every process " \
           "below it killed" in text, text[-5000:]
    assert re.search(r"call 1: node 2 \([^)]*\) taken out, spare node 1 \([^)]*\) brought in \(restart 2 of 3\): "
                     r"node 2 got a spot termination notice", text), text[-5000:]
    assert "call 1: node 2 was told to stop and the gang goes on without it" in text, text[-5000:]
    assert _on_nodes(first) == [0, 2] and _on_nodes(second) == [0, 1], (first, second)
    for start in (first, second):  # each from a peer's copy in memory, at the world size it had
        assert all(s["from_memory"] and s["resumed"] >= 3 and s["world"] == 4 for s in start.values()), start
    joined = _joined(gang)
    assert joined["roles"] == {"0": "active", "1": "active", "2": "out"}, joined
    silent, told = joined["restarts"]
    assert silent["kind"] == "unresponsive" and (silent["swapped_out"], silent["swapped_in"]) == (1, 2), silent
    assert told["kind"] == "preempted" and (told["swapped_out"], told["swapped_in"]) == (2, 1), told
    assert silent["steps_lost"] <= 1 and told["steps_lost"] <= 1, joined["restarts"]
    # Node history: the frozen node is blamed though the step went on; one told to go is nobody's fault.
    assert _history_of(joined, 1) == {"frozen": 1} and "frozen" not in _history_of(joined, 2), joined["history"]


def test_with_a_spare_a_workers_sigterm_swaps_it_out_and_only_its_task_ends(gang):
    proc, console = _start(gang, {"restarts": 2, "spares": 1}, SHORT_ARGS)
    try:
        _wait_for_step(gang, console, 4, 3)
        task = _task_of(proc.pid, 1)
        os.kill(task, signal.SIGTERM)
        _ended_alone(console, task)
        started = _wait_starts(gang, console, 1, 4)
        text = console.finish(gang)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, text[-5000:]
    assert re.search(r"call 1: node 1 \([^)]*\) taken out, spare node 2 \([^)]*\) brought in \(restart 1 of 2\): "
                     r"node 1 was told to stop \(SIGTERM", text), text[-5000:]
    assert _on_nodes(started) == [0, 2], started
    assert all(s["from_memory"] and s["resumed"] >= 3 and s["world"] == 4 for s in started.values()), started
    joined = _joined(gang)
    assert joined["roles"] == {"0": "active", "1": "out", "2": "active"}, joined
    (told,) = joined["restarts"]
    assert told["kind"] == "preempted" and (told["swapped_out"], told["swapped_in"]) == (1, 2), told


def test_with_min_nodes_a_frozen_node_is_left_behind_and_grows_back_then_a_sigterm_shrinks_the_gang(gang):
    proc, console = _start(gang, {"restarts": 4, "min_nodes": 2})
    try:
        _wait_for_step(gang, console, 6, 3)
        frozen = _freeze(proc.pid, 2)
        smaller = _wait_starts(gang, console, 1, 4)
        assert _gone(frozen) == [], _gone(frozen)
        grown = _wait_starts(gang, console, 2, 6)  # node 2's task started again, back, and the gang grew at a snapshot
        task = _task_of(proc.pid, 1)
        os.kill(task, signal.SIGTERM)
        _ended_alone(console, task)
        last = _wait_starts(gang, console, 3, 4)
        text = console.finish(gang)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, text[-5000:]
    assert re.search(r"call 1: node 2 \([^)]*\) sent no heartbeat for \d+s \(heartbeat_timeout=5s\): frozen or cut "
                     r"off from the network; the gang trains on without it, on 2 nodes \(world size 4, restart 1 of "
                     r"4\)", text), text[-5000:]
    assert re.search(r"call 1: node 2 \([^)]*\) back: the gang grows to 3 nodes again \(world size 6, restart 2 of 4\)",
                     text), text[-5000:]
    assert re.search(r"call 1: node 1 was told to stop \(SIGTERM.*; the gang trains on without it, on 2 nodes "
                     r"\(world size 4, restart 3 of 4\)", text), text[-5000:]
    assert _on_nodes(smaller) == [0, 1] and _on_nodes(grown) == [0, 1, 2] and _on_nodes(last) == [0, 2]
    for start in (smaller, grown, last):
        assert all(s["from_memory"] for s in start.values()), start
    joined = _joined(gang)
    assert joined["roles"] == {"0": "active", "1": "out", "2": "active"}, joined
    assert [r["kind"] for r in joined["restarts"]] == ["unresponsive", "regrown", "preempted"], joined["restarts"]
    assert _history_of(joined, 2) == {"frozen": 1}, joined["history"]


def test_with_min_nodes_a_spot_notice_shrinks_the_gang(gang):
    proc, console = _start(gang, {"restarts": 2, "min_nodes": 2}, SHORT_ARGS)
    try:
        _wait_for_step(gang, console, 6, 3)
        task = _task_of(proc.pid, 2)
        _notice(gang, 2)
        _ended_alone(console, task)
        smaller = _wait_starts(gang, console, 1, 4)
        text = console.finish(gang)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, text[-5000:]
    assert re.search(r"call 1: node 2 got a spot termination notice .*; the gang trains on without it, on 2 nodes "
                     r"\(world size 4, restart 1 of 2\)", text), text[-5000:]
    assert _on_nodes(smaller) == [0, 1], smaller
    assert all(s["from_memory"] and s["resumed"] >= 3 and s["world"] == 4 for s in smaller.values()), smaller
    joined = _joined(gang)
    assert joined["roles"] == {"0": "active", "1": "active", "2": "out"}, joined
