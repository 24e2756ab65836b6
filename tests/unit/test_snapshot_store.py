"""The node's snapshot store: its budget, the two it keeps, a torn snapshot dropped, all freed at close."""

import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import textwrap

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.gang.snapshot_shelf import KEEP, Shelf, default_budget
from metaflow_extensions.torchrun.plugins.torchrun.gang.snapshot_store import SnapshotStore
from metaflow_extensions.torchrun.plugins.torchrun.procs import snapshot_codec as codec
from metaflow_extensions.torchrun.plugins.torchrun.procs import snapshot_wire as wire
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import SNAPSHOT_ENV
from metaflow_extensions.torchrun.plugins.torchrun.procs.snapshot_client import StoreClient, StoreError
from proc_helpers import wait_until


def snapshot(step, size=1000, fill=1):
    """A sealed snapshot of one uint8 tensor, made without torch."""
    manifest = json.dumps({"format": 1, "step": step, "tree": {"t": 0},
                           "tensors": [["uint8", [size], 0, size]]}).encode()
    start, total = codec.layout(manifest, size)
    blob = bytearray(total)
    codec.write_head(memoryview(blob), manifest, size)
    blob[start:start + size] = bytes([fill % 256]) * size
    codec.seal(memoryview(blob), total)
    return blob


# -- the shelf: memory and its budget -------------------------------------------------


def test_it_keeps_the_newest_two_per_key():
    shelf = Shelf(budget=1 << 20)
    for step in range(5):
        ticket = shelf.begin("rank-0", 100)
        shelf.finish(ticket, step, bytearray(100))
    assert shelf.steps("rank-0") == [3, 4] and KEEP == 2
    assert shelf.used() == 200 and shelf.get("rank-0").step == 4 and shelf.get("rank-0", 3).step == 3
    assert shelf.get("rank-0", 2) is None and shelf.steps("rank-1") == []


def test_a_step_saved_again_replaces_the_later_ones_of_a_timeline_left_behind():
    shelf = Shelf(budget=1 << 20)
    for step in (7, 8, 6):
        shelf.finish(shelf.begin("local-0", 10), step, bytearray(10))
    assert shelf.steps("local-0") == [6]


def test_the_budget_holds_under_repeated_saves_dropping_the_keys_oldest_first():
    shelf = Shelf(budget=250)
    peak = 0
    for step in range(20):
        ticket = shelf.begin("rank-0", 100)
        assert ticket is not None, step
        peak = max(peak, shelf.used())
        shelf.finish(ticket, step, bytearray(100))
        peak = max(peak, shelf.used())
    assert peak <= 250 and shelf.steps("rank-0") == [18, 19]  # the older dropped while the next arrived
    assert shelf.begin("rank-1", 200) is None  # another key's copies are never dropped for it
    assert shelf.steps("rank-0") == [18, 19]


def test_an_abandoned_arrival_gives_its_room_back():
    shelf = Shelf(budget=100)
    ticket = shelf.begin("rank-0", 100)
    assert shelf.begin("rank-1", 1) is None
    shelf.abandon(ticket)
    assert shelf.used() == 0 and shelf.begin("rank-1", 100) is not None


def test_a_plan_over_budget_names_both_sizes():
    shelf = Shelf(budget=300 << 20)
    assert shelf.plan("local-0", 100 << 20) is None
    why = shelf.plan("local-1", 60 << 20)
    assert "a snapshot of 60.0 MB needs 120.0 MB" in why and "budget is 300.0 MB" in why
    assert "200.0 MB of it planned for other ranks" in why
    assert shelf.plan("local-0", 140 << 20) is None  # its own earlier plan is replaced, not added


def test_the_default_budget_is_a_share_of_available_memory(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 8000000 kB\nMemAvailable:    4000000 kB\n")
    assert default_budget(0.25, str(meminfo)) == 1000000 * 1024
    assert default_budget(0.25, str(tmp_path / "none")) == 1 << 30
    assert default_budget() > 0


# -- the store, over its socket --------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    s = SnapshotStore(str(tmp_path / "snapshots"), budget=1 << 20)
    yield s
    s.close()


def test_ranks_reach_it_in_a_private_directory_named_by_one_variable(store, tmp_path):
    assert store.environ() == {SNAPSHOT_ENV: store.path}
    assert stat.S_IMODE(os.stat(tmp_path / "snapshots").st_mode) == 0o700
    assert stat.S_ISSOCK(os.stat(store.path).st_mode)


def test_a_rank_puts_and_gets_back_the_same_bytes(store):
    client = StoreClient(store.path)
    for step in (1, 2, 3):
        assert client.put("rank-0", step, memoryview(snapshot(step, fill=step))) is None
    assert client.steps("rank-0") == ([2, 3], None)
    got = client.get("rank-0", 2)
    assert got == snapshot(2, fill=2) and codec.check(got).step == 2
    assert client.get("rank-0", 1) is None and client.get("local-3", 1) is None
    client.close()


def test_a_put_over_budget_is_refused_and_the_plan_says_so_first(tmp_path):
    with SnapshotStore(str(tmp_path / "s"), budget=3000) as small:
        client = StoreClient(small.path)
        why, budget = client.plan("rank-0", 2000)
        assert budget == 3000 and "a snapshot of 2000 bytes needs 4000 bytes" in why and "budget is 3000 bytes" in why
        assert "over the node's snapshot budget of 3000 bytes" in client.put("rank-0", 1, memoryview(snapshot(1, 4000)))
        assert client.put("rank-0", 1, memoryview(snapshot(1, 1000))) is None  # a smaller one still fits
        client.close()


def test_long_socket_paths_work(tmp_path):
    deep = tmp_path / ("d" * 100) / ("e" * 50)
    deep.mkdir(parents=True)
    with SnapshotStore(str(deep / "snapshots"), budget=1 << 20) as s:
        assert len(s.path) > 107
        client = StoreClient(s.path)
        assert client.put("local-0", 0, memoryview(snapshot(0))) is None
        client.close()


def framed(body):
    return struct.pack("!I", len(body)) + body


@pytest.mark.parametrize("frame", [
    struct.pack("!I", wire.MAX_HEADER + 1),
    framed(b"hello"),
    framed(b"[]"),
    framed(b'{"op":"put","key":"x/../y","step":1,"size":100}'),
    framed(b'{"op":"put","key":"rank-0","step":-1,"size":100}'),
    framed(b'{"op":"put","key":"rank-0","step":1,"size":1e9}'),
    framed(b'{"op":"get","key":"rank-0","step":true}'),
    framed(b'{"op":"rm","key":"rank-0"}'),
    framed(b'{"op":"put","key":"rank-01","step":1,"size":100}'),
])
def test_a_malformed_frame_ends_that_connection_only(store, frame):
    client = StoreClient(store.path)
    client.put("rank-0", 1, memoryview(snapshot(1)))
    bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bad.connect(store.path)
    bad.sendall(frame)
    bad.settimeout(10)
    assert bad.recv(10) == b""  # dropped
    bad.close()
    assert client.steps("rank-0") == ([1], None)
    client.close()


TORN_WRITER = textwrap.dedent("""
    import json, socket, struct, sys
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sys.argv[1])
    size = int(sys.argv[2])
    head = json.dumps({"op": "put", "key": "rank-0", "step": 2, "size": size}).encode()
    sock.sendall(struct.pack("!I", len(head)) + head)
    sock.recv(100)  # go
    sock.sendall(b"x" * (size // 2))
    print("half", flush=True)
    sys.stdin.read()
""")


def test_a_writer_killed_mid_snapshot_leaves_the_previous_one_whole(store):
    client = StoreClient(store.path)
    first = snapshot(1, 50000, fill=7)
    client.put("rank-0", 1, memoryview(first))
    writer = subprocess.Popen([sys.executable, "-c", TORN_WRITER, store.path, str(len(first))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert writer.stdout.readline() == b"half\n"
        assert wait_until(lambda: store.shelf.used() == 2 * len(first), timeout=30)  # arriving, counted
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        writer.stdin.close()
        writer.stdout.close()
    assert wait_until(lambda: store.shelf.used() == len(first), timeout=30)  # dropped
    assert client.steps("rank-0") == ([1], None) and client.get("rank-0", 1) == first
    client.close()


def test_close_frees_everything(tmp_path):
    s = SnapshotStore(str(tmp_path / "s"), budget=1 << 20)
    client = StoreClient(s.path)
    client.put("rank-0", 1, memoryview(snapshot(1, 100000)))
    assert s.shelf.used() > 100000
    s.close()
    assert s.shelf.used() == 0 and s.shelf.steps("rank-0") == [] and not os.path.exists(s.path)
    with pytest.raises(StoreError):
        client.steps("rank-0")
    client.close()
