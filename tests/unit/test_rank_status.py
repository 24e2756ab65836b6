"""procs/status.py: the one rank status record, as the rank writes it, its agent
completes it, the gang carries it and the result keeps it."""

from __future__ import annotations

import json
import os

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.gang import messages
from metaflow_extensions.torchrun.plugins.torchrun.procs import status
from metaflow_extensions.torchrun.plugins.torchrun.procs.status import RankStatus, StatusError
from metaflow_extensions.torchrun.plugins.torchrun.record import result

FIELDS = ["rank", "local_rank", "group_rank", "restart", "pid", "start", "end", "exit_code"]


def test_one_record_everywhere():
    assert messages.RankStatus is RankStatus and result.RankRecord is RankStatus


def test_the_file_holds_the_eight_fields_in_order(tmp_path):
    record = RankStatus(3, 1, group_rank=0, restart=2, pid=42, start=1.5)
    assert status.write_status(str(tmp_path), record)
    path = tmp_path / "rank-3.status.json"
    assert list(json.loads(path.read_text())) == FIELDS
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert status.read_statuses(str(tmp_path)) == {3: record}
    assert sorted(os.listdir(tmp_path)) == ["rank-3.status.json"]  # no temporary left


def test_an_exit_keeps_a_known_end():
    started = RankStatus(0, 0, start=1.0)
    assert started.ended(-15, 9.0) == RankStatus(0, 0, start=1.0, end=9.0, exit_code=-15)
    assert RankStatus(0, 0, start=1.0, end=5.0).ended(0, 9.0).end == 5.0
    assert started.ended(1, 4.0).duration == 3.0 and started.duration is None


def test_the_wire_round_trip_keeps_node_0s_group_rank():
    record = RankStatus(0, 0, group_rank=0, restart=0, pid=7, start=1.0, end=2.0, exit_code=0)
    assert RankStatus.from_wire(record.to_wire()) == record
    assert RankStatus.from_wire({"rank": 1, "local_rank": 0}) == RankStatus(1, 0)


@pytest.mark.parametrize("field, value", [
    ("rank", "3"), ("rank", -1), ("rank", True), ("local_rank", None), ("group_rank", 1.5),
    ("pid", -2), ("restart", -1), ("exit_code", 1 << 32), ("start", -1.0), ("end", float("nan")),
    ("end", "later"), ("start", 1e13),
])
def test_the_wire_checks_every_field(field, value):
    data = dict(RankStatus(1, 0, start=1.0).to_wire(), **{field: value})
    with pytest.raises(StatusError, match=repr(field)):
        RankStatus.from_wire(data)
    with pytest.raises(messages.ProtocolError, match=repr(field)):  # a peer's report: the peer is dropped
        messages.NodeReport.from_wire({"ranks": [data]})


def test_a_file_is_read_leniently(tmp_path):
    odd = {"rank": 2, "local_rank": "x", "group_rank": True, "restart": None, "pid": 1.5,
           "start": "soon", "end": float("inf"), "exit_code": [1]}
    assert RankStatus.from_file(odd) == RankStatus(2, -1)
    assert RankStatus.from_file({"rank": "2"}) is None and RankStatus.from_file([1]) is None
    (tmp_path / "rank-0.status.json").write_text("{half")
    (tmp_path / "rank-1.status.json").write_text(json.dumps({"rank": 1, "local_rank": 1, "pid": 9}))
    assert status.read_statuses(str(tmp_path)) == {1: RankStatus(1, 1, pid=9)}


def test_for_the_wire_a_record_is_brought_within_bounds():
    """A rank that could not read its own number wrote -1; the wire wants 0 and up."""
    odd = RankStatus(-1, -5, group_rank=-9, restart=-1, pid=-3, start=-1.0, exit_code=1 << 40)
    assert odd.for_wire() == RankStatus(0, -1, group_rank=-1, restart=0, pid=-1)
    RankStatus.from_wire(odd.for_wire().to_wire())  # accepted
