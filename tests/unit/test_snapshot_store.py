"""The node's snapshot store: slots a rank writes in place, its budget, the two it keeps, a torn
snapshot never seen, a rank unable to shrink a slot, all freed at close."""

import errno
import json
import mmap
import os
import time
import signal
import socket
import stat
import struct
import subprocess
import sys
import textwrap

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.snapshots.node.shelf import KEEP, SLOTS_PER_KEY, Shelf, megabytes
from metaflow_extensions.torchrun.plugins.torchrun.snapshots.node.store import SnapshotStore
from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import codec
from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import memory
from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import wire
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import SNAPSHOT_ENV
from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank.client import StoreClient, StoreError
from proc_helpers import wait_until


def snapshot(step, size=1000, fill=1, sealed=True):
    """A snapshot of one uint8 tensor, made without torch (sealed: with its digest, as a peer sends it)."""
    manifest = json.dumps({"format": 1, "step": step, "tree": {"t": 0},
                           "tensors": [["uint8", [size], 0, size]]}).encode()
    start, total = codec.layout(manifest, size)
    blob = bytearray(total)
    codec.write_head(memoryview(blob), manifest, size)
    blob[start:start + size] = bytes([fill % 256]) * size
    if sealed:
        codec.seal(memoryview(blob), total)
    return blob


class Writer:
    """A rank's side, by hand: a slot asked for, mapped once by its id, written, committed."""

    def __init__(self, path):
        self.client = StoreClient(path)
        self.maps = {}
        self.granted = []

    def put(self, key, step, blob, commit=True, start=0):
        granted, dropped, why = self.client.slot(key, len(blob))
        for ident in dropped:
            self.maps.pop(ident).close()
        if granted is None:
            return why
        self.granted.append(granted.slot)
        if granted.fd is not None:
            self.maps[granted.slot] = memory.map_shared(granted.fd, granted.capacity)
            os.close(granted.fd)
        self.maps[granted.slot][:len(blob)] = bytes(blob)
        return self.client.commit(key, granted.slot, step, len(blob), start) if commit else granted

    def close(self):
        for m in self.maps.values():
            m.close()
        self.client.close()


# -- the shelf: slots and their budget -------------------------------------------------


def fill(shelf, key, step, size=100):
    slot = shelf.begin(key, size)
    assert slot is not None, step
    slot.map[:size] = bytes([step % 256]) * size
    shelf.finish(slot, step, size)
    return slot


def test_it_keeps_the_newest_two_per_key_in_three_slots_handed_out_in_turn():
    shelf = Shelf(budget=1 << 20)
    ids = [fill(shelf, "rank-0", step).id for step in range(8)]
    assert shelf.steps("rank-0") == [6, 7] and KEEP == 2 and SLOTS_PER_KEY == 3
    assert len(set(ids)) == 3 and ids[3:6] == ids[:3]  # reused, never made anew
    assert shelf.used() == 3 * memory.room(100)
    slot = shelf.pin("rank-0", 6)
    assert slot.step == 6 and slot.map[0] == 6 and shelf.pin("rank-0", 5) is None
    shelf.unpin(slot)
    assert shelf.newest() == 7 and shelf.steps("rank-1") == [] and Shelf(10).newest() is None
    shelf.clear()


def test_a_step_saved_again_replaces_the_later_ones_of_a_timeline_left_behind():
    shelf = Shelf(budget=1 << 20)
    for step in (7, 8, 6):
        fill(shelf, "local-0", step)
    assert shelf.steps("local-0") == [6] and shelf.newest() == 6
    assert shelf.used() <= SLOTS_PER_KEY * memory.room(100)
    shelf.clear()


def test_the_budget_holds_over_50_saves_and_growing_sizes():
    room = memory.room(100_000)
    shelf = Shelf(budget=3 * room)
    peak = 0
    for step in range(50):
        slot = shelf.begin("rank-0", 100_000)
        assert slot is not None, step
        peak = max(peak, shelf.used())
        shelf.finish(slot, step, 100_000)
        peak = max(peak, shelf.used())
    assert peak <= shelf.budget and shelf.steps("rank-0") == [48, 49]
    assert shelf.begin("rank-1", 1000) is None  # another key's copies are never dropped for it
    assert shelf.steps("rank-0") == [48, 49]
    bigger = shelf.begin("rank-0", 150_000)  # a grown snapshot: the spare and the oldest give way
    assert bigger is not None and shelf.used() <= shelf.budget and shelf.steps("rank-0") == [49]
    shelf.clear()
    assert shelf.used() == 0


def test_an_abandoned_write_leaves_the_snapshots_and_its_slot_is_reused():
    shelf = Shelf(budget=1 << 20)
    fill(shelf, "rank-0", 1)
    torn = shelf.begin("rank-0", 100)
    torn.map[:10] = b"x" * 10
    shelf.abandon(torn)
    assert shelf.steps("rank-0") == [1] and shelf.arriving() == 0
    assert shelf.begin("rank-0", 100) is torn
    shelf.clear()


def test_a_slot_being_read_is_neither_reused_nor_closed_until_let_go():
    shelf = Shelf(budget=1 << 20)
    first = fill(shelf, "rank-0", 0)
    pinned = shelf.pin("rank-0", 0)
    for step in range(1, 6):
        assert fill(shelf, "rank-0", step) is not first
    assert pinned.map[0] == 0 and pinned.readers == 1
    shelf.unpin(pinned)
    assert fill(shelf, "rank-0", 6) is first or first.id not in shelf.alive([first.id])
    shelf.clear()


def test_the_budget_is_decided_for_all_of_a_nodes_ranks_at_once():
    """Each of 4 local ranks' plans fits alone; all 4 do not: the first plan refuses for the node, once, both
    sizes and where the budget came from named; every other rank is refused too (first come, first served let
    two save a snapshot no step could resume from)."""
    room = SLOTS_PER_KEY * memory.room(60 << 20)
    shelf = Shelf(budget=3 * room, source="25% of the room under the container's memory limit")
    why, made = shelf.plan("local-0", 60 << 20, ranks=4)
    assert made and "a snapshot of 60.0 MB on each of this node's 4 local ranks needs" in why
    assert "the newest two copies and the one being written" in why and "budget is %s" % megabytes(3 * room) in why
    assert "(25% of the room under the container's memory limit)" in why
    assert [shelf.plan("local-%d" % r, 1 << 20, ranks=4) for r in (1, 2, 3)] == [(why, False)] * 3  # said once
    assert shelf.begin("local-1", 1 << 20, owner=1) is None and shelf.used() == 0


def test_a_node_whose_ranks_fit_plans_them_all_and_a_growth_past_it_frees_them_all():
    shelf = Shelf(budget=4 * SLOTS_PER_KEY * memory.room(10 << 20))
    assert all(shelf.plan("local-%d" % r, 10 << 20, ranks=4) == (None, False) for r in range(4))
    for r in range(4):
        fill(shelf, "local-%d" % r, 1, size=10 << 20)
    assert shelf.used() > 0
    why, made = shelf.plan("local-2", 11 << 20, ranks=4)  # an optimizer's state appears on one rank
    assert made and "4 local ranks" in why and shelf.used() == 0 and shelf.steps("local-0") == []
    assert shelf.plan("local-0", 10 << 20, ranks=4) == (why, False)


def test_a_ranks_pinned_buffers_count_in_the_nodes_budget():
    slots = SLOTS_PER_KEY * memory.room(10 << 20)
    assert Shelf(budget=slots).plan("rank-0", 10 << 20, ranks=1) == (None, False)
    why, made = Shelf(budget=slots).plan("rank-0", 10 << 20, pinned=int(2.25 * (10 << 20)), ranks=1)
    assert made and "its CUDA state's two pinned buffers, 22.5 MB" in why


# -- the store, over its socket --------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    s = SnapshotStore(str(tmp_path / "snapshots"), budget=1 << 20)
    yield s
    s.close()


@pytest.fixture
def writer(store):
    w = Writer(store.path)
    yield w
    w.close()


def test_ranks_reach_it_in_a_private_directory_named_by_one_variable(store, tmp_path):
    assert store.environ() == {SNAPSHOT_ENV: store.path}
    assert stat.S_IMODE(os.stat(tmp_path / "snapshots").st_mode) == 0o700
    assert stat.S_ISSOCK(os.stat(store.path).st_mode)


def test_a_rank_writes_in_place_and_gets_back_the_same_bytes(store, writer):
    for step in (1, 2, 3, 4, 5):
        assert writer.put("rank-0", step, snapshot(step, fill=step, sealed=False)) is None
    assert len(set(writer.granted)) == 3 and len(writer.maps) == 3  # each slot's fd came once
    assert writer.client.steps("rank-0") == ([4, 5], None, 5)
    got = writer.client.get("rank-0", 4)
    assert got.blob == snapshot(4, fill=4, sealed=False) and codec.check(got.blob, digest=False).step == 4
    assert (got.source, got.node, got.newest) == (None, None, 5)
    loaded = store.last_load()
    assert loaded is not None and loaded[:3] == (4, None, 5) and store.newest() == 5
    assert abs(loaded[3] - time.time()) < 60  # when step 4 was committed: the work up to it is kept
    assert writer.client.get("rank-0", 1) is None and writer.client.get("local-3", 1) is None


def test_a_slot_cannot_be_shrunk_or_grown_by_the_rank(store, writer):
    granted = writer.put("rank-0", 1, snapshot(1), commit=False)
    assert granted.slot in writer.maps
    client = StoreClient(store.path)  # another connection is given the fd again: the rank's own copy of it
    again, _, _ = client.slot("rank-0", 1000)
    for size in (0, 10, again.capacity * 2):
        with pytest.raises(PermissionError):
            os.ftruncate(again.fd, size)
    with pytest.raises(PermissionError):
        import fcntl
        fcntl.fcntl(again.fd, fcntl.F_ADD_SEALS, 0)  # sealed against more seals, and so against unsealing
    assert os.fstat(again.fd).st_size == again.capacity and memory.is_sealed(again.fd)
    os.close(again.fd)
    client.close()


def test_a_commit_of_what_is_no_snapshot_is_refused_and_the_previous_stands(store, writer):
    assert writer.put("rank-0", 1, snapshot(1, sealed=False)) is None
    garbage = bytearray(snapshot(2, sealed=False))
    garbage[30:40] = b"\xff" * 10  # the manifest broken
    assert "not a whole snapshot" in writer.put("rank-0", 2, garbage)
    assert "holds step 3, not 2" in writer.put("rank-0", 2, snapshot(3, sealed=False))
    assert writer.client.steps("rank-0") == ([1], None, 1)
    other = StoreClient(store.path)  # a slot handed to one rank is not another's to commit
    assert "no slot of rank-0" in other.commit("rank-0", writer.granted[-1], 1, 1000)
    other.close()


def test_a_put_over_budget_is_refused_and_the_plan_says_so_first(tmp_path):
    with SnapshotStore(str(tmp_path / "s"), budget=40000) as small:
        writer = Writer(small.path)
        assert "over the node's snapshot budget of 40000 bytes" in writer.put("rank-0", 1, snapshot(1, 50000))
        assert writer.put("rank-0", 1, snapshot(1, 1000)) is None  # a smaller one still fits
        why, budget, said = writer.client.plan("rank-0", 20000, 0, 1)
        assert budget == 40000 and "a snapshot of 19.5 KB on this node's rank needs" in why and not said
        assert "budget is 39.1 KB" in why and writer.client.plan("rank-0", 100, 0, 1) == (why, 40000, True)
        assert writer.put("rank-0", 2, snapshot(2, 1000)) == why and small.shelf.used() == 0  # the node's: off
        writer.close()


def test_grown_snapshots_get_new_slots_and_the_rank_is_told_which_to_unmap(store, writer):
    for step in range(3):
        writer.put("rank-0", step, snapshot(step, 1000, sealed=False))
    small = set(writer.granted)
    for step in range(3, 8):
        assert writer.put("rank-0", step, snapshot(step, 20000, sealed=False)) is None
    assert not small & set(writer.maps) and len(writer.maps) == 3  # the small ones unmapped, as told
    assert store.shelf.used() == 3 * memory.room(snapshot(0, 20000).__len__())


def test_long_socket_paths_work(tmp_path):
    deep = tmp_path / ("d" * 100) / ("e" * 50)
    deep.mkdir(parents=True)
    with SnapshotStore(str(deep / "snapshots"), budget=1 << 20) as s:
        assert len(s.path) > 107
        writer = Writer(s.path)
        assert writer.put("local-0", 0, snapshot(0)) is None
        writer.close()


def framed(body):
    return struct.pack("!I", len(body)) + body


@pytest.mark.parametrize("frame", [
    struct.pack("!I", wire.MAX_HEADER + 1),
    framed(b"hello"),
    framed(b"[]"),
    framed(b'{"op":"slot","key":"x/../y","size":100}'),
    framed(b'{"op":"slot","key":"rank-0","size":-1}'),
    framed(b'{"op":"slot","key":"rank-0","size":1e9}'),
    framed(b'{"op":"commit","key":"rank-0","slot":0,"step":1,"size":100}'),
    framed(b'{"op":"get","key":"rank-0","step":true}'),
    framed(b'{"op":"put","key":"rank-0","step":1,"size":100}'),
    framed(b'{"op":"slot","key":"rank-01","size":100}'),
])
def test_a_malformed_frame_ends_that_connection_only(store, writer, frame):
    writer.put("rank-0", 1, snapshot(1))
    bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bad.connect(store.path)
    bad.sendall(frame)
    bad.settimeout(10)
    assert bad.recv(10) == b""  # dropped
    bad.close()
    assert writer.client.steps("rank-0") == ([1], None, 1)


TORN_WRITER = textwrap.dedent("""
    import mmap, os, sys
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import memory
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank.client import StoreClient
    client = StoreClient(sys.argv[1])
    size = int(sys.argv[2])
    granted, _, _ = client.slot("rank-0", size)
    m = memory.map_shared(granted.fd, granted.capacity)
    m[:size // 2] = b"x" * (size // 2)
    print("half", flush=True)
    sys.stdin.read()
""")


def test_a_writer_killed_mid_copy_leaves_the_previous_snapshot_and_its_slot_is_reused(store, writer):
    first = snapshot(1, 50000, fill=7, sealed=False)
    writer.put("rank-0", 1, first)
    proc = subprocess.Popen([sys.executable, "-c", TORN_WRITER, store.path, str(len(first))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"half\n"
        assert store.shelf.arriving() == 1
        used = store.shelf.used()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()
    assert wait_until(lambda: store.shelf.arriving() == 0, timeout=30)  # void: never committed
    assert store.shelf.used() == used  # its slot kept for the key's next save, not made anew
    assert writer.client.steps("rank-0") == ([1], None, 1) and writer.client.get("rank-0", 1).blob == first
    assert writer.put("rank-0", 2, snapshot(2, 50000, sealed=False)) is None and store.shelf.used() == used


def test_close_frees_everything_and_closes_every_memfd(tmp_path):
    s = SnapshotStore(str(tmp_path / "s"), budget=1 << 20)
    writer = Writer(s.path)
    for step in range(4):
        writer.put("rank-0", step, snapshot(step, 100000))
    fds = [slot.fd for slot in s.shelf._slots()]
    assert len(fds) == 3 and s.shelf.used() > 300000
    s.close()
    assert s.shelf.used() == 0 and s.shelf.steps("rank-0") == [] and not os.path.exists(s.path)
    for fd in fds:
        with pytest.raises(OSError) as caught:
            os.fstat(fd)
        assert caught.value.errno == errno.EBADF
    with pytest.raises(StoreError):
        writer.client.steps("rank-0")
    writer.close()


def test_without_sealed_memfds_snapshots_are_off_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "unavailable", lambda: "no sealed memfd here: snapshots are off")
    with SnapshotStore(str(tmp_path / "s"), budget=1 << 20) as s:
        client = StoreClient(s.path)
        assert client.plan("rank-0", 1000, 0, 1)[0] == "no sealed memfd here: snapshots are off"
        assert client.slot("rank-0", 1000)[0] is None and s.shelf.used() == 0
        client.close()
    assert mmap.PAGESIZE == memory.PAGE


def test_a_slot_that_cannot_be_made_is_refused_with_the_reason(store, writer, monkeypatch):
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.node import shelf as snapshot_shelf

    def no_memory(size, name):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(snapshot_shelf.memory, "create", no_memory)
    assert "no snapshot slot could be made: [Errno 12] Cannot allocate memory" in writer.put("rank-0", 1, snapshot(1))
    assert writer.client.steps("rank-0") == ([], None, None)  # the same connection goes on


def test_a_pinned_slot_keeps_its_step_and_size_while_newer_saves_push_it_out():
    shelf = Shelf(budget=1 << 20)
    fill(shelf, "rank-0", 1, size=300)
    pinned = shelf.pin("rank-0", 1)
    for step in range(2, 7):
        fill(shelf, "rank-0", step, size=300)
    assert shelf.steps("rank-0") == [5, 6] and (pinned.step, pinned.size) == (1, 300)  # what a push announces
    shelf.unpin(pinned)
    shelf.clear()


def test_the_store_says_when_the_current_starts_ranks_first_saved_and_not_a_peers_copy(store, writer):
    """The ledger's mark of a restart's training begun: its ranks' first commit, not a copy a peer pushed."""
    assert store.first_saved_at() is None
    peer = store.shelf.begin("rank-1", 4096)
    store.shelf.finish(peer, 3, 100, source=(0, 1))
    assert store.first_saved_at() is None  # a peer's copy is not this node's ranks' training
    assert writer.put("rank-0", 3, snapshot(3, sealed=False)) is None
    first = store.first_saved_at()
    assert first is not None and abs(first - time.time()) < 60
    assert writer.put("rank-0", 4, snapshot(4, sealed=False)) is None
    assert store.first_saved_at() == first
    store.new_start()
    assert store.first_saved_at() is None


# -- one timeline: a snapshot is its start's, and a gang of another size drops the others' shards ---------


def test_a_step_left_by_two_starts_is_told_apart_by_its_start(store, writer):
    """A rank killed in its save of step 5 in start 1 keeps start 0's step 5, while the ranks that saved it
    again hold start 1's: each is held, named and read as its start's, never as the other's."""
    for step in (4, 5):
        assert writer.put("local-0", step, snapshot(step, sealed=False, fill=step), start=0) is None
        assert writer.put("local-1", step, snapshot(step, sealed=False, fill=step), start=0) is None
    assert writer.put("local-0", 5, snapshot(5, sealed=False, fill=50), start=1) is None
    assert writer.client.held("local-0") == [(0, 4), (1, 5)] and writer.client.held("local-1") == [(0, 4), (0, 5)]
    assert writer.client.get("local-0", 5, start=0) is None  # start 0's step 5 was replaced here
    assert writer.client.get("local-0", 5, start=1).blob[-33] == 50
    assert writer.client.get("local-1", 5, start=0).blob[-33] == 5 and writer.client.get("local-1", 5, 1) is None


def test_a_gang_of_another_size_drops_the_other_sizes_shards_and_returns_their_memory(tmp_path):
    said = []
    store = SnapshotStore(str(tmp_path / "s"), budget=1 << 24, say=said.append)
    writer = Writer(store.path)
    try:
        for key in ("rank-0-of-6", "rank-1-of-6", "local-0"):
            for step in (1, 2, 3):
                assert writer.put(key, step, snapshot(step, 100000, sealed=False)) is None
        before = store.shelf.used()
        assert writer.client.held("rank-0-of-4") == []  # the shrunk gang's first ask
        assert store.shelf.steps("rank-0-of-6") == store.shelf.steps("rank-1-of-6") == []
        assert store.shelf.steps("local-0") == [2, 3]  # replicated state serves any size
        assert store.shelf.used() == before * 1 // 3 and store.sharded()[1:] == (4, {4, 6})
        assert said == ["the gang's ranks are 4 now, not 6: this node's snapshots of other sizes are dropped "
                        "(624.0 KB returned)"]
        assert writer.put("rank-0-of-4", 7, snapshot(7, sealed=False)) is None
        assert store.sharded()[0] and writer.client.held("rank-0-of-6") == []  # and back at 6: nothing of before
        assert store.shelf.steps("rank-0-of-4") == []
    finally:
        writer.close()
        store.close()

