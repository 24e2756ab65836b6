"""The gang's typed protocol: every message survives its wire form, and every
malformed field of every message type is refused (ProtocolError), never passed
on as an arbitrary object."""

from __future__ import annotations

import json

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.gang import messages as msg
from metaflow_extensions.torchrun.plugins.torchrun.gang.wire import ProtocolError, decode, encode
from metaflow_extensions.torchrun.plugins.torchrun.procs.flight import NO_GROUP, OK, FlightGroup, FlightSummary

CAUSE = Cause(CauseKind.RANK_FAILED, "rank 3 failed", node_index=1, rank=3, exit_code=1, time=1.5)
REPORT = msg.NodeReport(
    ranks=(msg.RankStatus(2, 0, pid=10, start=1.0, end=2.0, exit_code=0), msg.RankStatus(3, 1, exit_code=1)),
    tails={3: {"stdout": ("a", "b"), "stderr": ("boom",)}},
    started=1.0, ended=2.0,
)

# One of each, with every optional field set where there is one.
EXAMPLES = [
    msg.Challenge(nonce=b"n" * 32),
    msg.Hello(node_index=5, nonce=b"c" * 32, proof="f" * 64, host="node-5", pid=42),
    msg.Probe(node_index=7, nonce=b"p" * 32, proof="a" * 64),
    msg.Welcome(proof="e" * 64, cause=CAUSE),
    msg.Welcome(proof="e" * 64),
    msg.Reject("node 1 is taken"),
    msg.Heartbeat(quiet=2.5),
    msg.Heartbeat(),
    msg.Call(3, "train.py"),
    msg.Go(3, 29500),
    msg.CallDone(0, REPORT, rank0=b"\x80\x04pickle", rank0_proof="d" * 64),
    msg.CallDone(1, msg.NodeReport(), rank0_size=1 << 30),
    msg.CallAllDone(2),
    msg.Failed(CAUSE, call=0, report=REPORT, restart=2),
    msg.Failed(CAUSE, call=0, report=REPORT),
    msg.Failed(CAUSE),
    msg.Stacks(0, {2: "Current thread 0x1", 3: ""},
               {2: FlightSummary(OK, (FlightGroup("0", 5, "all_reduce", False, "default_pg"),), 6),
                3: FlightSummary(NO_GROUP)}),
    msg.StacksIn(4),
    msg.Leave(2, True),
    msg.AllLeft(),
    msg.Abort(CAUSE),
    msg.Restart(0, 1, 29501, CAUSE),
    msg.Preflight(versions={"torch": "2.13.0", "python": "3.11.7"},
                  checks=(msg.PreflightCheck("shm", "warn", "64 MiB", "1 GiB", "@kubernetes(shared_memory=)"),)),
    msg.SnapshotPeers(0, 1, ("10.0.0.3", 40001), ("::1", 40002), 2),  # newer than the hand-written codecs: last
]


def test_every_message_type_has_an_example():
    assert {type(m) for m in EXAMPLES} == set(msg.KINDS.values())
    assert set(msg.KINDS) == set(msg.MessageType)


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: m.TYPE.value)
def test_round_trip_through_the_wire(message):
    line = encode(message.to_wire())
    assert line.endswith(b"\n") and b"\n" not in line[:-1]
    back = msg.parse(decode(line[:-1]))
    assert back == message and type(back) is type(message)


# For every message type, fields with a wrong type, size or range. Each is
# applied to the example's wire form; the parse must refuse it.
BAD = {
    "challenge": [("nonce", "00" * 31), ("nonce", "zz" * 32), ("nonce", 5), ("protocol", "4"), ("protocol", -1)],
    "hello": [("node_index", -1), ("node_index", 1 << 20), ("node_index", 1.0), ("node_index", True),
              ("nonce", None), ("proof", "f" * 65), ("proof", 3), ("pid", "7"), ("host", "h" * 256),
              ("protocol", None)],
    "probe": [("node_index", -1), ("node_index", 1 << 20), ("node_index", 1.0), ("node_index", True),
              ("node_index", None), ("node_index", "7"), ("nonce", None), ("nonce", "00" * 31), ("nonce", "zz" * 32),
              ("proof", None), ("proof", "a" * 65), ("proof", ["a"]), ("protocol", None), ("protocol", "5"),
              ("protocol", 1 << 17)],
    "welcome": [("proof", None), ("proof", "e" * 65), ("cause", "a string"), ("cause", {"kind": "nope"})],
    "hb": [("quiet", "1"), ("quiet", -1), ("quiet", 1e12), ("quiet", True), ("quiet", [1]), ("quiet", 10**400)],
    "call": [("index", -1), ("index", "0"), ("index", None), ("entry", ["x"]), ("entry", "x" * 1001),
             ("snapshot_port", 0), ("snapshot_port", 65536), ("snapshot_port", "4000")],
    "snapshot_peers": [("index", None), ("restart", -1), ("buddy", "10.0.0.1:5"), ("source", ["name", 5]),
                       ("source_node", -1), ("source_node", 1 << 20)],
    "go": [("index", None), ("rdzv_port", 0), ("rdzv_port", 65536), ("rdzv_port", "29500")],
    "call_done": [("index", "0"), ("rank0", "!!!not base64"), ("rank0", 5), ("rank0_proof", "d" * 65),
                  ("rank0_size", -1), ("report", "a string"), ("report", {"ranks": "x"}),
                  ("report", {"ranks": [{"rank": "3", "local_rank": 0}]}),
                  ("report", {"tails": {"x": {}}}),
                  ("report", {"tails": {"3": {"stdout": ["a"] * 21}}}),
                  ("report", {"ranks": [{"rank": 0, "local_rank": 0}] * 4097})],
    "call_all_done": [("index", None), ("index", 1.5)],
    "failed": [("cause", None), ("cause", "x"), ("cause", {"kind": "failed", "summary": ""}), ("call", -2),
               ("call", "0"), ("report", []), ("restart", -1), ("restart", "1"), ("restart", 1 << 17)],
    "restart": [("index", None), ("restart", 0), ("restart", "1"), ("restart", None), ("rdzv_port", 0),
                ("rdzv_port", 65536), ("cause", None), ("cause", {"kind": "nope", "summary": "x"})],
    "stacks": [("stacks", None), ("stacks", []), ("call", None), ("call", "0"), ("flights", []),
               ("flights", "x")],
    "stacks_in": [("index", None), ("index", -1), ("index", "0"), ("index", 1.5)],
    "leave": [("calls", "many"), ("calls", -1), ("ok", "yes"), ("ok", None)],
    "abort": [("cause", None), ("cause", {"summary": "no kind"})],
    "preflight": [("versions", None), ("versions", {"torch": 2}), ("versions", {"gpu_brand": "x"}),
                  ("versions", {"torch": "x" * 65}), ("checks", "ok"), ("checks", [{"name": "shm"}]),
                  ("checks", [{"name": "shm", "status": "great"}]), ("checks", [{"name": "", "status": "ok"}]),
                  ("checks", [{"name": "x", "status": "ok"}] * 17)],
}


def _cases():
    seen = set()
    for message in EXAMPLES:
        kind = message.TYPE.value
        if kind in seen or kind not in BAD:
            continue
        seen.add(kind)
        for name, value in BAD[kind]:
            yield pytest.param(message, name, value, id="%s-%s-%s" % (kind, name, json.dumps(value)[:20]))


@pytest.mark.parametrize("message, name, value", list(_cases()))
def test_a_malformed_field_is_refused(message, name, value):
    wire = dict(message.to_wire())
    wire[name] = value
    with pytest.raises(ProtocolError):
        msg.parse(wire)


def test_every_message_type_that_has_fields_is_covered_by_the_malformed_cases():
    with_fields = {m.TYPE.value for m in EXAMPLES if m.to_wire().keys() - {"type"}}
    assert with_fields - {"reject"} <= set(BAD)  # a reject's reason is shown, never acted on


@pytest.mark.parametrize("wire", [{}, {"type": "joined", "nodes": [0, 1]}, {"type": 3}, {"type": None}])
def test_an_unknown_type_is_refused(wire):
    with pytest.raises(ProtocolError):
        msg.parse(wire)


def test_parse_as_refuses_another_type():
    with pytest.raises(ProtocolError, match="expected hello, got challenge"):
        msg.parse_as(msg.Challenge(nonce=b"n" * 32).to_wire(), msg.Hello)


def test_a_report_is_bounded_and_cut_to_fit():
    assert msg.NodeReport.from_wire({"tails": {"1": {"stdout": ["x" * 5000]}}}).tails[1]["stdout"][0] == "x" * 1000
    cut = REPORT.cut()
    assert cut.truncated and cut.tails == {} and cut.ranks == REPORT.ranks


def test_a_rank_status_on_node_0_keeps_its_group_rank():
    """Was: ``group_rank=0`` read back as -1 (an ``or -1`` after the check)."""
    status = msg.RankStatus(0, 0, group_rank=0, restart=0, pid=7, start=1.0, end=2.0, exit_code=0)
    back = msg.RankStatus.from_wire(dict(vars(status)))  # as NodeReport puts it on the wire
    assert back.group_rank == 0 and back.restart == 0 and back == status


@pytest.mark.parametrize("address", [["host.example", 5], ["10.0.0.1", 0], ["10.0.0.1", 70000], ["10.0.0.1"],
                                     ["10.0.0.1", True], "10.0.0.1:5", ["1" * 70, 5]])
def test_a_snapshot_peer_is_an_ip_literal_and_a_port(address):
    """A store's address is never a name to resolve nor a port out of range: refused as the message's."""
    with pytest.raises(ProtocolError):
        msg.parse({"type": "snapshot_peers", "index": 0, "buddy": address})


def test_a_call_carries_its_snapshot_port_and_leaves_it_off_when_none():
    assert "snapshot_port" not in msg.Call(1, "train.py").to_wire()
    assert msg.parse(msg.Call(1, "train.py", 40000).to_wire()).snapshot_port == 40000
