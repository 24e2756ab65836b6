"""The record codec (codec.py): the wire it writes is the one the hand-written
codecs wrote (byte for byte: the lines below were written by them, at 8facd96),
and what it reads is checked field by field as they did."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Dict, Optional, Tuple

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause
from metaflow_extensions.torchrun.plugins.torchrun.base.codec import LOCAL, NEED, SKIP, Int, Items, Real, Record, Text, Via
from metaflow_extensions.torchrun.plugins.torchrun.gang import messages as msg
from metaflow_extensions.torchrun.plugins.torchrun.gang.bench import Bench
from metaflow_extensions.torchrun.plugins.torchrun.gang.gang_progress import NodeProgress, ProgressRecord, Straggler
from metaflow_extensions.torchrun.plugins.torchrun.gang.wire import ProtocolError
from metaflow_extensions.torchrun.plugins.torchrun.procs.culprit import Culprits, Suspect
from metaflow_extensions.torchrun.plugins.torchrun.procs.flight import FlightGroup, FlightSummary
from metaflow_extensions.torchrun.plugins.torchrun.procs.rank_progress import ProgressReport
from test_gang_messages import CAUSE, EXAMPLES

# test_gang_messages.EXAMPLES, in order, as the hand-written codecs wrote them.
GOLDEN = [
    '{"type": "challenge", "protocol": 9, "nonce": "6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e"}',
    '{"type": "hello", "protocol": 9, "node_index": 5, "host": "node-5", "pid": 42, "nonce": "6363636363636363636363636363636363636363636363636363636363636363", "proof": "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff"}',
    '{"type": "probe", "protocol": 9, "node_index": 7, "nonce": "7070707070707070707070707070707070707070707070707070707070707070", "proof": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}',
    '{"type": "welcome", "proof": "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", "cause": {"kind": "failed", "summary": "rank 3 failed", "node_index": 1, "rank": 3, "exit_code": 1, "secondary": false, "missing": [], "time": 1.5}}',
    '{"type": "welcome", "proof": "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee"}',
    '{"type": "reject", "reason": "node 1 is taken"}',
    '{"type": "hb", "quiet": 2.5}',
    '{"type": "hb"}',
    '{"type": "call", "index": 3, "entry": "train.py"}',
    '{"type": "go", "index": 3, "rdzv_port": 29500}',
    '{"type": "call_done", "index": 0, "report": {"ranks": [{"rank": 2, "local_rank": 0, "group_rank": -1, "restart": 0, "pid": 10, "start": 1.0, "end": 2.0, "exit_code": 0}, {"rank": 3, "local_rank": 1, "group_rank": -1, "restart": 0, "pid": -1, "start": null, "end": null, "exit_code": 1}], "tails": {"3": {"stdout": ["a", "b"], "stderr": ["boom"]}}, "started": 1.0, "ended": 2.0, "truncated": false}, "rank0": "gARwaWNrbGU=", "rank0_proof": "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"}',
    '{"type": "call_done", "index": 1, "report": {"ranks": [], "tails": {}, "started": null, "ended": null, "truncated": false}, "rank0_size": 1073741824}',
    '{"type": "call_all_done", "index": 2}',
    '{"type": "failed", "cause": {"kind": "failed", "summary": "rank 3 failed", "node_index": 1, "rank": 3, "exit_code": 1, "secondary": false, "missing": [], "time": 1.5}, "call": 0, "report": {"ranks": [{"rank": 2, "local_rank": 0, "group_rank": -1, "restart": 0, "pid": 10, "start": 1.0, "end": 2.0, "exit_code": 0}, {"rank": 3, "local_rank": 1, "group_rank": -1, "restart": 0, "pid": -1, "start": null, "end": null, "exit_code": 1}], "tails": {"3": {"stdout": ["a", "b"], "stderr": ["boom"]}}, "started": 1.0, "ended": 2.0, "truncated": false}, "restart": 2}',
    '{"type": "failed", "cause": {"kind": "failed", "summary": "rank 3 failed", "node_index": 1, "rank": 3, "exit_code": 1, "secondary": false, "missing": [], "time": 1.5}, "call": 0, "report": {"ranks": [{"rank": 2, "local_rank": 0, "group_rank": -1, "restart": 0, "pid": 10, "start": 1.0, "end": 2.0, "exit_code": 0}, {"rank": 3, "local_rank": 1, "group_rank": -1, "restart": 0, "pid": -1, "start": null, "end": null, "exit_code": 1}], "tails": {"3": {"stdout": ["a", "b"], "stderr": ["boom"]}}, "started": 1.0, "ended": 2.0, "truncated": false}}',
    '{"type": "failed", "cause": {"kind": "failed", "summary": "rank 3 failed", "node_index": 1, "rank": 3, "exit_code": 1, "secondary": false, "missing": [], "time": 1.5}}',
    '{"type": "stacks", "call": 0, "stacks": {"2": "Current thread 0x1", "3": ""}, "flights": {"2": {"state": "ok", "entries": 6, "groups": [{"name": "0", "entered": 5, "op": "all_reduce", "done": false, "desc": "default_pg"}]}, "3": {"state": "no_group", "entries": 0, "groups": []}}}',
    '{"type": "stacks_in", "index": 4}',
    '{"type": "leave", "calls": 2, "ok": true}',
    '{"type": "all_left"}',
    '{"type": "abort", "cause": {"kind": "failed", "summary": "rank 3 failed", "node_index": 1, "rank": 3, "exit_code": 1, "secondary": false, "missing": [], "time": 1.5}}',
    '{"type": "restart", "index": 0, "restart": 1, "rdzv_port": 29501, "cause": {"kind": "failed", "summary": "rank 3 failed", "node_index": 1, "rank": 3, "exit_code": 1, "secondary": false, "missing": [], "time": 1.5}}',
    '{"type": "preflight", "versions": {"torch": "2.13.0", "python": "3.11.7"}, "checks": [{"name": "shm", "status": "warn", "found": "64 MiB", "expected": "1 GiB", "fix": "@kubernetes(shared_memory=)"}]}',
]

STRAGGLER = Straggler(3, "h", "1-2", 2.34567, 12.345, "sig")
MORE = [
    msg.Go(1, 2, Bench((3,), (1,))),
    msg.Restart(0, 1, 29501, CAUSE, Bench((), (1,)), swapped_in=2),
    msg.Heartbeat(-0.5, NodeProgress(ranks=2, step_min=1, step_median=2, step_max=3, total=9, rate=1.23456789,
                                     rate_min=0.5, slowest_rank=1, rank_lo=0, rank_hi=1, stalled=0.3, cpu=0.77777,
                                     gpu=50.0, metrics={"loss": 0.123456789})),
    msg.Heartbeat(1.0, NodeProgress()),
    msg.Hello(1, b"a" * 32, "p", host="h" * 300),
    FlightSummary("ok", (FlightGroup("0", 1, "x", True),), 3, "gloo", "n"),
    FlightSummary("empty"),
    STRAGGLER,
    ProgressRecord(),
    ProgressRecord(step=3, total=10, percent=30.0, eta_seconds=1.5, steps_per_second=0.25, metrics={"a": 1.5},
                   nodes_reporting=2, signal="s",
                   slowest={"node_index": 1, "host": "h", "ranks": "1", "rank": None, "ratio": 0.5},
                   stragglers=(STRAGGLER,), stragglers_more=2, chart_groups=("a",), chart=((1.0, (None,)),)),
    Suspect(1, None, "h", "w"),
    Suspect(1, 2, "h", "w", "f"),
    Culprits("c", (1, 2), (Suspect(1, None, "h", "w"),), 1, "flight_recorder", "0", 5, "u"),
    ProgressReport(1, 2),
    ProgressReport(1, 2, 3, {"x": 1.0}, 5.5),
    Bench(),
    Bench((3, 4), (1,)),
]
MORE_GOLDEN = [
    '{"type": "go", "index": 1, "rdzv_port": 2, "bench": {"spares": [3], "out": [1]}}',
    '{"type": "restart", "index": 0, "restart": 1, "rdzv_port": 29501, "cause": {"kind": "failed", "summary": "rank 3 failed", "node_index": 1, "rank": 3, "exit_code": 1, "secondary": false, "missing": [], "time": 1.5}, "bench": {"spares": [], "out": [1]}, "swapped_in": 2}',
    '{"type": "hb", "quiet": 0.0, "progress": {"ranks": 2, "step_min": 1, "step_median": 2, "step_max": 3, "total": 9, "rate": 1.2346, "rate_min": 0.5, "slowest_rank": 1, "rank_lo": 0, "rank_hi": 1, "stalled": 0.3, "cpu": 0.7778, "gpu": 50.0, "metrics": {"loss": 0.123457}}}',
    '{"type": "hb", "quiet": 1.0, "progress": {"ranks": 0, "step_min": 0, "step_median": 0, "step_max": 0}}',
    '{"type": "hello", "protocol": 9, "node_index": 1, "host": "hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh", "pid": 0, "nonce": "6161616161616161616161616161616161616161616161616161616161616161", "proof": "p"}',
    '{"state": "ok", "entries": 3, "groups": [{"name": "0", "entered": 1, "op": "x", "done": true, "desc": ""}], "recorder": "gloo", "note": "n"}',
    '{"state": "empty", "entries": 0, "groups": []}',
    '{"node_index": 3, "host": "h", "ranks": "1-2", "ratio": 2.35, "seconds": 12.3, "signal": "sig"}',
    '{"step": null, "total": null, "percent": null, "eta_seconds": null, "steps_per_second": null, "metrics": {}, "nodes_reporting": 0, "signal": null, "slowest": null, "stragglers": [], "stragglers_more": 0}',
    '{"step": 3, "total": 10, "percent": 30.0, "eta_seconds": 1.5, "steps_per_second": 0.25, "metrics": {"a": 1.5}, "nodes_reporting": 2, "signal": "s", "slowest": {"node_index": 1, "host": "h", "ranks": "1", "rank": null, "ratio": 0.5}, "stragglers": [{"node_index": 3, "host": "h", "ranks": "1-2", "ratio": 2.35, "seconds": 12.3, "signal": "sig"}], "stragglers_more": 2}',
    '{"rank": 1, "node": null, "host": "h", "where": "w"}',
    '{"rank": 1, "node": 2, "host": "h", "where": "w", "flight": "f"}',
    '{"signal": "flight_recorder", "collective": "c", "waiting": [1, 2], "waiting_count": 2, "suspects": [{"rank": 1, "node": null, "host": "h", "where": "w"}], "more": 1, "group": "0", "seq": 5, "unread": "u"}',
    '{"rank": 1, "step": 2, "total": null, "metrics": {}, "time": 0.0}',
    '{"rank": 1, "step": 2, "total": 3, "metrics": {"x": 1.0}, "time": 5.5}',
    '{"spares": [], "out": []}',
    '{"spares": [3, 4], "out": [1]}',
]


@pytest.mark.parametrize("record, line", list(zip(EXAMPLES, GOLDEN)) + list(zip(MORE, MORE_GOLDEN)),
                         ids=lambda x: type(x).__name__ if not isinstance(x, str) else "")
def test_the_wire_is_what_the_hand_written_codecs_wrote(record, line):
    assert json.dumps(record.to_wire()) == line


# -- the codec's rules, on a record of its own ------------------------------------------


class Oops(ValueError):
    pass


@dataclass(frozen=True)
class Inner(Record):
    ERROR = Oops
    n: Annotated[int, Int(0, 9)]


@dataclass(frozen=True)
class Sample(Record):
    ERROR = Oops
    DROP_NONE = True
    count: Annotated[int, Int(0, 10)]
    need: Annotated[int, Int(0, 10), NEED] = 1
    real: Annotated[Optional[float], Real(0.0, 5.0, digits=1)] = None
    name: Annotated[str, Text(4)] = ""
    items: Annotated[Tuple[Inner, ...], Items(2)] = ()
    by_rank: Annotated[Dict[Annotated[int, Int(0, 9)], Annotated[str, Text(3)]], Items(2)] = field(default_factory=dict)
    skipped: Annotated[int, Int(0, 10), SKIP] = 0
    local: Annotated[int, LOCAL] = 7
    via: Annotated[Optional[int], Via(lambda v: int(v, 16), lambda v: "%x" % v)] = None


def test_a_record_round_trips_and_its_marks_hold():
    record = Sample(3, real=1.25, name="abcdef", items=(Inner(1),), by_rank={2: "xyzw"}, skipped=0, local=9, via=255)
    wire = record.to_wire()
    # cut and rounded to what the reader takes; the skipped default and the local field left off
    assert wire == {"count": 3, "need": 1, "real": 1.2, "name": "abcd", "items": [{"n": 1}], "by_rank": {"2": "xyz"},
                    "via": "ff"}
    assert Sample.from_wire(wire) == Sample(3, real=1.2, name="abcd", items=(Inner(1),), by_rank={2: "xyz"}, via=255)
    assert Sample(3, real=9.0).to_wire()["real"] == 5.0  # clamped: never what the reader refuses


@pytest.mark.parametrize("bad, said", [
    ({"count": True}, "'count': not an integer in [0, 10]"),
    ({"count": 11}, "'count'"),
    ({"count": 1.0}, "'count'"),
    ({"need": None}, "'need'"),
    ({"real": float("inf")}, "'real'"),
    ({"real": 10**400}, "'real'"),
    ({"real": "1"}, "'real'"),
    ({"name": "toolong"}, "'name'"),
    ({"items": [{"n": 1}] * 3}, "'items'"),
    ({"items": [{"n": 10}]}, "field 'items': field 'n'"),
    ({"items": [5]}, "'items': not an object"),
    ({"by_rank": {"x": "a"}}, "'by_rank': a key that is not a number"),
    ({"by_rank": {"1": 2}}, "'by_rank'"),
    ({"by_rank": {"10": "a"}}, "'by_rank': not an integer in [0, 9]"),
    ({"via": "zz"}, "'via'"),
])
def test_a_bad_field_is_refused_by_name_with_the_record_s_error(bad, said):
    with pytest.raises(Oops) as e:
        Sample.from_wire({"count": 1, "need": 1, **bad})
    assert said in str(e.value)


def test_absent_fields_take_their_default_and_required_ones_are_refused():
    assert Sample.from_wire({"count": 0, "need": 2, "skipped": None}) == Sample(0, need=2)
    with pytest.raises(Oops, match="'count'"):
        Sample.from_wire({"need": 2})
    with pytest.raises(Oops, match="not an object"):
        Sample.from_wire([1])


def test_a_nested_record_s_error_names_where_it_sits():
    with pytest.raises(ProtocolError, match="field 'report': field 'ranks': field 'rank'"):
        msg.parse({"type": "call_done", "index": 0, "report": {"ranks": [{"rank": -1, "local_rank": 0}]}})
    with pytest.raises(ProtocolError, match="field 'bench': more than 64 nodes, or a node twice"):
        msg.parse({"type": "go", "index": 0, "rdzv_port": 1, "bench": {"spares": [1], "out": [1]}})


def test_a_field_without_bounds_cannot_be_read():
    @dataclass(frozen=True)
    class Unbounded(Record):
        n: int

    @dataclass(frozen=True)
    class Unsaid(Record):
        cause: Cause  # read leniently by Cause.from_wire (None for a bad one): a field must say how, with Via

    with pytest.raises(TypeError, match="field 'n' has no bounds"):
        Unbounded.from_wire({"n": 1})
    with pytest.raises(TypeError, match="no reader for"):
        Unsaid.from_wire({"cause": None})


# -- the compiled reader and writer (one function per class, made at its first use) -------------------


def test_a_default_made_by_a_factory_is_fresh_in_every_record():
    one, two = Sample.from_wire({"count": 1, "need": 1}), Sample.from_wire({"count": 1, "need": 1})
    assert one.by_rank == {} and one.by_rank is not two.by_rank
    assert one.local == 7 and one == Sample(1)  # a local field at its default
    assert hash(Inner.from_wire({"n": 2})) == hash(Inner(2))


def test_a_record_with_more_to_its_making_is_made_by_its_call():
    made = []

    @dataclass(frozen=True)
    class Checked(Record):
        n: Annotated[int, Int(0, 9)]

        def __post_init__(self):
            made.append(self.n)

    assert Checked.from_wire({"n": 3}) == Checked(3) and made == [3, 3]


def test_a_problem_across_fields_is_the_record_s_error():
    @dataclass(frozen=True)
    class Ordered(Record):
        ERROR = Oops
        low: Annotated[int, Int(0, 9)]
        high: Annotated[int, Int(0, 9)]

        def problem(self):
            return None if self.low <= self.high else "low over high"

    assert Ordered.from_wire({"low": 1, "high": 2}) == Ordered(1, 2)
    with pytest.raises(Oops, match="^low over high$"):
        Ordered.from_wire({"low": 3, "high": 2})


@pytest.mark.parametrize("nonce", ["00 " * 21 + "0", "0x" * 32, "\u0660" * 64])
def test_hex_is_digits_only(nonce):
    assert len(nonce) == 64
    with pytest.raises(ProtocolError, match="field 'nonce'"):
        msg.parse({"type": "challenge", "protocol": 9, "nonce": nonce})


def test_a_name_that_is_not_a_message_type_is_refused_whatever_it_is():
    for name in (None, 5, ["hb"], {"hb": 1}, "HB", "hb "):
        with pytest.raises(ProtocolError, match="unknown message type"):
            msg.parse({"type": name})
    assert msg.parse({"type": msg.MessageType.HEARTBEAT}) == msg.Heartbeat()  # the enum is its text


def test_a_line_is_utf_8_json_and_nothing_else():
    from metaflow_extensions.torchrun.plugins.torchrun.gang import wire

    assert wire.decode(b'{"type": "hb", "quiet": 1.5}') == {"type": "hb", "quiet": 1.5}
    for line in (b'\xff\xfe{\x00}\x00', b'{"quiet": NaN}', b'{"quiet": -Infinity}', b'{"a": "\xe9"}', b"[1]", b"{"):
        assert wire.decode(line) is None
    assert wire.encode({"type": "hb"}) == b'{"type":"hb"}\n'
    with pytest.raises(ValueError):
        wire.encode({"quiet": float("nan")})
