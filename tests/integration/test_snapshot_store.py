"""Two real gloo ranks save a snapshot every step; one is SIGKILLed mid-training; started again,
both load the newest step they both hold, weights and momentum bit for bit as saved. No flow:
the test plays the task (it runs the stores) and torchrun's agent (it starts and kills the ranks).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.snapshots.node.peer import PeerKey
from metaflow_extensions.torchrun.plugins.torchrun.snapshots.node.store import SnapshotStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "snapshot_worker.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = b"k" * 32


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ranks:
    """The ranks a test started: every one killed and reaped at the end, whatever happened."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.started = []

    def start(self, stores, steps, replicated, pause=0.0):
        port = free_port()
        procs = []
        for rank, store in enumerate(stores):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank if len(set(stores)) == 1 else 0),
                       WORLD_SIZE=str(len(stores)), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       PYTHONPATH=REPO, **store.environ())
            argv = [sys.executable, WORKER, str(self.log(rank)), str(steps), "1" if replicated else "0", str(pause)]
            procs.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE))
        self.started += procs
        return procs

    def log(self, rank):
        return self.tmp_path / ("rank-%d.jsonl" % rank)

    def lines(self, rank):
        path = self.log(rank)
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def close(self):
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def ranks(tmp_path):
    r = Ranks(tmp_path)
    yield r
    r.close()


def kill_mid_training(ranks, procs, victim, after_steps):
    """The victim SIGKILLed once it saved ``after_steps``; the rest stopped as torchrun's agent stops them."""
    deadline = time.monotonic() + 300
    while sum("saved" in line for line in ranks.lines(victim)) < after_steps:
        assert procs[victim].poll() is None, procs[victim].stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "rank %d never saved %d steps" % (victim, after_steps)
        time.sleep(0.05)
    os.kill(procs[victim].pid, signal.SIGKILL)
    procs[victim].wait()
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
    return max(line["saved"] for line in ranks.lines(victim) if "saved" in line)


def quiet(*stores):
    deadline = time.monotonic() + 30
    while any(store.shelf.arriving() for store in stores) and time.monotonic() < deadline:
        time.sleep(0.05)


def check_resumed(ranks, procs, expected):
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()[-3000:]
    for rank in range(len(procs)):
        lines = ranks.lines(rank)
        loaded = [line for line in lines if "loaded" in line]
        assert [line["loaded"] for line in loaded] == [expected], lines[-5:]
        saved_then = [line["digest"] for line in lines if line.get("saved") == expected]
        assert saved_then and loaded[0]["digest"] == saved_then[0]  # bit for bit: the same sha256
    return procs


def test_a_rank_killed_mid_training_resumes_at_the_newest_step_both_hold(tmp_path, ranks):
    with SnapshotStore(str(tmp_path / "node-0"), budget=256 << 20) as store:
        first = ranks.start([store, store], steps=10000, replicated=True, pause=0.02)
        last = kill_mid_training(ranks, first, victim=1, after_steps=6)
        quiet(store)
        held = set(store.shelf.steps("local-0")) & set(store.shelf.steps("local-1"))
        assert held, "no step held by both ranks"
        expected = max(held)
        assert last - 3 <= expected <= last
        check_resumed(ranks, ranks.start([store, store], steps=expected + 2, replicated=True), expected)


def test_a_spare_resumes_a_lost_nodes_shard_from_its_buddys_copy(tmp_path, ranks):
    node0 = SnapshotStore(str(tmp_path / "node-0"), budget=256 << 20, peer=PeerKey(SECRET, "g", 0),
                          host="127.0.0.1")
    node1 = SnapshotStore(str(tmp_path / "node-1"), budget=256 << 20, peer=PeerKey(SECRET, "g", 1),
                          host="127.0.0.1", buddy=("127.0.0.1", node0.port))
    node0.peers_changed(("127.0.0.1", node1.port), [("127.0.0.1", node1.port)])
    spare = None
    try:
        first = ranks.start([node0, node1], steps=10000, replicated=False, pause=0.02)
        last = kill_mid_training(ranks, first, victim=1, after_steps=6)
        node1.close()  # the node is lost with its memory: rank 1's state is only on its buddy now
        quiet(node0)
        held = set(node0.shelf.steps("rank-0-of-2")) & set(node0.shelf.steps("rank-1-of-2"))
        assert held, "the buddy holds no step of rank 1 that rank 0 also holds"
        expected = max(held)
        assert last - 4 <= expected <= last
        spare = SnapshotStore(str(tmp_path / "spare"), budget=256 << 20, peer=PeerKey(SECRET, "g", 2),
                              host="127.0.0.1", peers=[("127.0.0.1", node0.port)])
        check_resumed(ranks, ranks.start([node0, spare], steps=expected + 2, replicated=False), expected)
    finally:
        for store in (node0, node1, spare):
            if store:
                store.close()
