"""Snapshots between two stores on 127.0.0.1: pushed to the buddy, fetched by a spare, strangers refused."""

import hashlib
import socket
import threading
import time

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.snapshots.node import peer
from metaflow_extensions.torchrun.plugins.torchrun.snapshots.node.store import SnapshotStore
from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import wire
from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank.client import StoreClient
from test_snapshot_store import Writer, snapshot

SECRET = b"s" * 32
GANG = "gang-1"


@pytest.fixture
def stores(tmp_path):
    made = []

    def make(node, secret=SECRET, buddy=None, peers=(), budget=1 << 22):
        said = []
        store = SnapshotStore(str(tmp_path / ("node-%d-%d" % (node, len(made)))), budget=budget,
                              peer=peer.PeerKey(secret, GANG, node), host="127.0.0.1", buddy=buddy, peers=peers,
                              say=said.append)
        store.said = said
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def address(store):
    return ("127.0.0.1", store.port)


def put(store, key, step, **kw):
    """A rank's save, as it writes it: in place, with no digest (the store computes one as it pushes)."""
    writer = Writer(store.path)
    blob = snapshot(step, sealed=False, **kw)
    assert writer.put(key, step, blob) is None
    writer.close()
    return blob


def held(store, key, step):
    slot = store.shelf.pin(key, step)
    try:
        return bytes(slot.map[:slot.size])
    finally:
        store.shelf.unpin(slot)


def test_a_shard_is_pushed_to_the_buddy_and_replicated_state_is_not(stores):
    buddy = stores(1)
    node = stores(0, buddy=address(buddy))
    blobs = [put(node, "rank-0", step, fill=step) for step in (1, 2, 3)]
    put(node, "local-0", 3)
    assert node.replicated(timeout=30)
    assert buddy.shelf.steps("rank-0")[-1] == 3
    copy = held(buddy, "rank-0", 3)  # the same bytes, and the digest computed at the push as its trailer
    assert copy[:-32] == bytes(blobs[-1][:-32]) and copy[-32:] == hashlib.sha256(copy[:-32]).digest()
    assert held(node, "rank-0", 3) == bytes(blobs[-1])  # the sender's slot is left as the rank wrote it
    assert buddy.shelf.steps("local-0") == [] and node.said == []


def test_a_spare_fetches_a_lost_nodes_shard_from_its_peer(stores):
    buddy = stores(1)
    lost = stores(0, buddy=address(buddy))
    blob = put(lost, "rank-2", 7, fill=9)
    assert lost.replicated(timeout=30)
    lost.close()
    spare = stores(2, peers=[("127.0.0.1", 1), address(buddy)])  # the first peer is gone: the next is asked
    client = StoreClient(spare.path)
    assert client.steps("rank-2") == ([7], 1, 7)  # node 1's copy (the second peer's)
    got = client.get("rank-2", 7)
    assert got.blob[:-32] == blob[:-32] and (got.source, got.node, got.newest) == (1, 1, 7)
    assert spare.last_load()[:3] == (7, 1, 7)
    assert client.steps("rank-5") == ([], None, 7)
    client.close()


def test_a_store_with_another_secret_is_refused_both_ways(stores):
    stranger = stores(1, secret=b"x" * 32)
    node = stores(0, buddy=address(stranger))
    put(node, "rank-0", 1)
    assert node.replicated(timeout=30)
    assert stranger.shelf.steps("rank-0") == []
    assert len(node.said) == 1 and "not copied" in node.said[0] and "secret" in node.said[0]
    put(node, "rank-0", 2)
    assert node.replicated(timeout=30) and len(node.said) == 1  # said once
    spare = stores(2, secret=b"y" * 32, peers=[address(node)])
    client = StoreClient(spare.path)
    assert client.steps("rank-0") == ([], None, None)
    client.close()


def test_a_stranger_without_the_secret_learns_nothing_and_stores_nothing(stores):
    node = stores(0)
    put(node, "rank-0", 1)
    sock = socket.create_connection(address(node), timeout=10)
    hello = wire.recv_header(sock)
    assert set(hello) == {"snapshot", "nonce"}
    wire.send_frame(sock, {"node": 1, "nonce": "00" * 16, "proof": "0" * 64})
    assert sock.recv(100) == b""
    sock.close()
    with pytest.raises(peer.PeerRefused):
        peer.connect(peer.PeerKey(b"z" * 32, GANG, 1), address(node))
    with pytest.raises(peer.PeerRefused):
        peer.connect(peer.PeerKey(SECRET, "another gang", 1), address(node))


def test_a_push_with_a_forged_frame_or_body_is_dropped_unread(stores):
    node = stores(0)
    key = peer.PeerKey(SECRET, GANG, 1)
    blob = snapshot(4, 5000)  # sealed: its trailer is its digest
    push = {"op": "push", "key": "rank-1", "step": 4, "size": len(blob)}
    body = {"key": "rank-1", "step": 4, "start": 0, "size": len(blob), "sha256": hashlib.sha256(blob[:-32]).hexdigest()}

    channel = peer.connect(key, address(node))  # a header changed after it was MACed: dropped at once
    signed = dict(push, mac=channel._mac(channel._out, 0, push), step=5)
    wire.send_frame(channel.sock, signed)
    assert channel.sock.recv(100) == b""
    channel.close()

    channel = peer.connect(key, address(node))  # an authenticated header, other bytes after it
    channel.send(push)
    assert channel.recv() == {"go": True}
    channel.send(body)
    corrupted = bytearray(blob)
    corrupted[100] ^= 1
    channel.sock.sendall(corrupted)
    assert channel.sock.recv(100) == b""
    channel.close()
    assert node.shelf.steps("rank-1") == [] and node.shelf.arriving() == 0

    channel = peer.connect(key, address(node))  # an authenticated digest the trailer does not repeat
    channel.send(push)
    assert channel.recv() == {"go": True}
    channel.send(body)
    channel.sock.sendall(bytes(blob[:-32]) + bytes(32))
    assert channel.sock.recv(100) == b""
    channel.close()
    assert node.shelf.steps("rank-1") == []

    channel = peer.connect(key, address(node))  # and the same, whole: kept
    channel.send(push)
    assert channel.recv() == {"go": True}
    channel.send(body)
    channel.sock.sendall(blob)
    assert channel.recv() == {"ok": True}
    channel.close()
    assert node.shelf.steps("rank-1") == [4] and held(node, "rank-1", 4) == bytes(blob)


def test_a_push_over_the_buddys_budget_is_refused_and_said(stores):
    buddy = stores(1, budget=2000)
    node = stores(0, buddy=address(buddy))
    put(node, "rank-0", 1, size=5000)
    assert node.replicated(timeout=30)
    assert buddy.shelf.steps("rank-0") == [] and "over this node's snapshot budget" in node.said[0]


def test_a_newer_snapshot_supersedes_one_not_yet_sent(stores):
    buddy = stores(1, budget=1 << 26)
    node = stores(0, buddy=address(buddy), budget=1 << 26)
    for step in range(30):
        put(node, "rank-0", step, size=200000)
    assert node.replicated(timeout=60)
    assert buddy.shelf.steps("rank-0")[-1] == 29
    assert node._pusher.pushed <= 30
    assert len(buddy.shelf._slots()) <= 3 and len(node.shelf._slots()) <= 3  # three slots a key, reused


def test_a_copy_keeps_its_start_and_a_buddy_of_another_gang_size_takes_no_shard_of_the_old(stores):
    """The buddy's copy, and a spare's fetch of it, are the start's that took it (a spare's ranks agree with
    the others on (start, step)); once the buddy's own ranks train at 4, a late push of a 6-rank shard is
    refused, so a gang grown back to 6 finds none of before its shrink there."""
    buddy = stores(1)
    node = stores(0, buddy=address(buddy))
    writer = Writer(node.path)
    assert writer.put("rank-2-of-6", 7, snapshot(7, sealed=False), start=3) is None
    assert node.replicated(timeout=30) and buddy.shelf.held("rank-2-of-6") == [(3, 7)]
    spare = stores(2, peers=[address(buddy)])
    client = StoreClient(spare.path)
    assert client.held("rank-2-of-6") == [(3, 7)] and client.get("rank-2-of-6", 7, start=2) is None
    client.close()
    buddy_rank = StoreClient(buddy.path)
    assert buddy_rank.held("rank-0-of-4") == []  # the buddy's ranks train at 4 now: its 6-rank shards go
    assert buddy.shelf.held("rank-2-of-6") == []
    assert writer.put("rank-2-of-6", 8, snapshot(8, sealed=False), start=3) is None
    assert node.replicated(timeout=30) and buddy.shelf.held("rank-2-of-6") == []
    assert "no longer train at" in node.said[0]
    buddy_rank.close()
    writer.close()


def test_a_spares_fetch_takes_as_long_as_its_bytes_and_the_rank_waits_through_it(stores, monkeypatch):
    """The rank's timeout bounds the store's silence, not the copy: a fetch slower than it goes on, the store
    telling the rank every KEEPALIVE seconds (it was one recv bounded by a fixed 120 s)."""
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.node import store as store_module
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import client as client_module

    buddy = stores(1)
    lost = stores(0, buddy=address(buddy))
    put(lost, "rank-2-of-4", 7, fill=9)
    assert lost.replicated(timeout=30)
    monkeypatch.setattr(client_module, "TIMEOUT", 0.5)
    monkeypatch.setattr(store_module, "KEEPALIVE", 0.1)
    send = peer.Channel.send_snapshot

    def slow_link(channel, slot):
        time.sleep(1.5)  # three times the rank's timeout
        send(channel, slot)

    monkeypatch.setattr(peer.Channel, "send_snapshot", slow_link)
    spare = stores(2, peers=[address(buddy)])
    client = StoreClient(spare.path)
    assert client.held("rank-2-of-4") == [(0, 7)]
    client.close()


def test_a_buddy_that_falls_behind_every_step_kept_is_said_once(stores, monkeypatch):
    buddy = stores(1)
    node = stores(0, buddy=address(buddy))
    for step in (1, 2):
        put(node, "rank-0-of-4", step)
    assert node.replicated(timeout=30) and node.said == []
    link = threading.Event()
    send = peer.Channel.send_snapshot

    def held_up(channel, slot):
        link.wait(60)
        send(channel, slot)

    monkeypatch.setattr(peer.Channel, "send_snapshot", held_up)
    for step in (3, 4):  # the push of 3 held: the buddy's 2 is older than the 3 and 4 kept here
        put(node, "rank-0-of-4", step)
    link.set()
    assert node.replicated(timeout=30) and buddy.shelf.steps("rank-0-of-4")[-1] == 4
    put(node, "rank-0-of-4", 5)
    assert len(node.said) == 1 and "holds step 2, older than every step this node keeps (3, 4; a push under way" in (
        node.said[0])
