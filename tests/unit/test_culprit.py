"""The rank that holds up a collective is named, by rank, node and host, before
where the ranks were (issue 39): from torch's Flight Recorder where the ranks'
summaries show it (real gloo dumps, flight_dumps/), else from the stacks. A real
gang's hang: tests/integration/test_stops.py."""

from __future__ import annotations

from metaflow_extensions.torchrun.plugins.torchrun.errors import GangAborted
from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.procs import culprit, failure_block
from metaflow_extensions.torchrun.plugins.torchrun.procs.culprit import collective, find_culprits
from metaflow_extensions.torchrun.plugins.torchrun.procs.flight import (EMPTY, NO_GROUP, OK, UNSUPPORTED, FlightGroup,
                                                                        FlightSummary, summarize)
from test_flight import dump as fr_dump

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/"


def dump(*frames: str) -> str:
    """faulthandler's text for a main thread with ``frames``, innermost first."""
    lines = ["Current thread 0x00007f0000000001 (most recent call first):"]
    lines += ['  File "%s", line %d in %s' % (f.split(":")[0], 10 + i, f.split(":")[1]) for i, f in enumerate(frames)]
    lines += ['  File "<frozen runpy>", line 88 in _run_code']
    return "\n".join(lines) + "\n"


IN_ALL_REDUCE = dump(C10D + "distributed_c10d.py:all_reduce", C10D + "c10d_logger.py:wrapper",
                     "/work/train.py:<module>")
IN_BARRIER = dump(C10D + "distributed_c10d.py:barrier", C10D + "c10d_logger.py:wrapper", "/work/train.py:<module>")
SLEEPING = dump("/work/train.py:<module>")
NODES = {0: 0, 1: 0, 2: 1, 3: 1}
HOSTS = {0: "host-a", 1: "host-b"}


def test_the_collective_a_rank_waits_in_is_the_call_its_code_made():
    nested = dump(C10D + "distributed_c10d.py:_store_based_barrier", C10D + "distributed_c10d.py:barrier",
                  "/work/train.py:<module>")
    assert collective(IN_ALL_REDUCE) == "all_reduce"
    assert collective(nested) == "barrier"
    assert collective(SLEEPING) is None
    assert collective("") is None


def test_the_rank_outside_the_collective_is_named_with_its_node_and_host():
    found = find_culprits({0: IN_ALL_REDUCE, 1: IN_ALL_REDUCE, 2: IN_ALL_REDUCE, 3: SLEEPING}, NODES, HOSTS)
    assert found is not None and found.collective == "all_reduce" and found.waiting == (0, 1, 2)
    assert [(s.rank, s.node, s.host) for s in found.suspects] == [(3, 1, "host-b")]
    assert found.lines() == [
        "Suspected cause: rank 3 is not in the all_reduce that ranks 0-2 wait in (from the stacks):",
        "  rank 3 (node 1, host-b): /work/train.py:10 in <module>",
    ]
    assert found.to_wire()["suspects"][0] == {"rank": 3, "node": 1, "host": "host-b",
                                              "where": "/work/train.py:10 in <module>"}


def test_a_rank_in_another_collective_or_without_a_stack_is_a_suspect_too():
    found = find_culprits({0: IN_ALL_REDUCE, 1: IN_BARRIER, 2: IN_ALL_REDUCE}, NODES, HOSTS, ranks=(0, 1, 2, 3))
    assert found is not None
    assert [(s.rank, s.where) for s in found.suspects] == [
        (1, "/work/train.py:12 in <module>"), (3, culprit.NO_STACK)]
    assert found.lines()[0] == "Suspected cause: 2 ranks are not in the all_reduce that ranks 0, 2 wait in (from the stacks):"


def test_nothing_is_claimed_without_a_rank_in_a_collective_or_one_outside_it():
    assert find_culprits({0: SLEEPING, 1: SLEEPING}, NODES, HOSTS) is None
    assert find_culprits({r: IN_ALL_REDUCE for r in range(4)}, NODES, HOSTS) is None


def test_many_suspects_are_counted_not_listed():
    stacks = {0: IN_ALL_REDUCE, **{r: SLEEPING for r in range(1, 4000)}}
    found = find_culprits(stacks, {}, {})
    assert found is not None and len(found.suspects) == culprit.NAMED and found.more == 3999 - culprit.NAMED
    assert found.lines()[0] == "Suspected cause: 3999 ranks are not in the all_reduce that rank 0 waits in (from the stacks):"
    assert found.lines()[1] == "  rank 1 (node ?, ?): /work/train.py:10 in <module>"
    assert found.lines()[-1] == "  ... and %d more ranks" % (3999 - culprit.NAMED)
    many_waiting = find_culprits({**{r: IN_ALL_REDUCE for r in range(4000)}, 4000: SLEEPING}, {}, {})
    assert many_waiting is not None
    wire = many_waiting.to_wire()  # the record stays small whatever the gang's size
    assert wire["waiting"] == list(range(culprit.RECORDED_WAITING)) and wire["waiting_count"] == 4000


def test_the_suspects_come_before_where_the_ranks_were():
    stacks = {0: IN_ALL_REDUCE, 1: IN_ALL_REDUCE, 2: IN_ALL_REDUCE, 3: SLEEPING}
    found = find_culprits(stacks, NODES, HOSTS)
    assert found is not None
    cause = Cause(CauseKind.HANG, "no output from any rank for 10 s (hang_timeout=10s)")
    text = str(GangAborted(0, cause, stacks=stacks, suspects=found.lines()))
    assert text.index("Suspected cause: rank 3") < text.index("rank 3 (node 1, host-b)") < text.index("Where the")
    block = failure_block.render(failure_block.Block(stacks=stacks, suspects=found.lines()))
    assert block.splitlines()[0].startswith("Suspected cause")


# -- from the Flight Recorder -------------------------------------------------------------

WAITS = summarize(fr_dump("gloo-hang-rank0.json"))  # in all_reduce #5 of group 0, open
SKIPPED = summarize(fr_dump("gloo-hang-rank1.json"))  # its last: barrier #4, completed


def _in(group: str, entered: int, op: str, done: bool, desc: str = "") -> FlightSummary:
    return FlightSummary(OK, (FlightGroup(group, entered, op, done, desc),), 10)


def test_the_rank_behind_the_collective_the_others_wait_in_is_named_from_the_recorder():
    """No c10d frame on any stack (async_op=True, then wait()): the recorder still names it."""
    flights = {0: WAITS, 1: WAITS, 2: WAITS, 3: SKIPPED}
    found = find_culprits({r: SLEEPING for r in range(4)}, NODES, HOSTS, flights=flights)
    assert found is not None and found.signal == culprit.FLIGHT_RECORDER
    assert (found.collective, found.group, found.seq, found.waiting) == ("all_reduce", "0", 5, (0, 1, 2))
    assert found.lines() == [
        "Suspected cause: rank 3 is not in the all_reduce #5 of process group 0 that ranks 0-2 wait in "
        "(from torch's Flight Recorder):",
        "  rank 3 (node 1, host-b): its last was barrier #4 (completed); at /work/train.py:10 in <module>",
    ]
    wire = found.to_wire()
    assert (wire["signal"], wire["group"], wire["seq"], wire["waiting"]) == ("flight_recorder", "0", 5, [0, 1, 2])
    assert wire["suspects"] == [{"rank": 3, "node": 1, "host": "host-b", "where": "/work/train.py:10 in <module>",
                                 "flight": "its last was barrier #4 (completed)"}]


def test_the_furthest_behind_comes_first_then_another_op_then_a_rank_that_did_not_answer():
    flights = {0: WAITS, 1: WAITS, 2: _in("0", 5, "broadcast", False, "default_pg"),
               3: _in("0", 2, "all_reduce", True, "default_pg"), 4: SKIPPED, 6: FlightSummary(NO_GROUP)}
    found = find_culprits({}, {}, {}, ranks=tuple(range(7)), flights=flights)
    assert found is not None and found.waiting == (0, 1)
    assert [(s.rank, s.flight, s.where) for s in found.suspects] == [
        (3, "its last was all_reduce #2 (completed)", ""), (4, "its last was barrier #4 (completed)", ""),
        (2, "entered broadcast #5 instead", ""), (5, "its Flight Recorder did not answer", "")]
    assert found.more == 1 and found.lines()[-1] == "  ... and 1 more ranks"


def test_ranks_outside_a_smaller_group_are_not_suspects_of_its_hang():
    """Group "7" (ranks 0-1 of 4): ranks 2 and 3 have no record of it and are not in it."""
    flights = {0: _in("7", 3, "all_gather", False), 1: _in("7", 2, "all_gather", True),
               2: _in("0", 9, "all_reduce", True, "default_pg"), 3: _in("0", 9, "all_reduce", True, "default_pg")}
    found = find_culprits({}, NODES, HOSTS, ranks=(0, 1, 2, 3), flights=flights)
    assert found is not None and [s.rank for s in found.suspects] == [1] and found.waiting == (0,)
    assert found.lines()[0].startswith("Suspected cause: rank 1 is not in the all_gather #3 of process group 7")


def test_the_stacks_name_them_when_no_recorder_shows_a_rank_waiting():
    stacks = {0: IN_ALL_REDUCE, 1: IN_ALL_REDUCE, 2: IN_ALL_REDUCE, 3: SLEEPING}
    for flights in ({}, {r: SKIPPED for r in range(4)}, {r: FlightSummary(EMPTY) for r in range(4)}):
        found = find_culprits(stacks, NODES, HOSTS, flights=flights)
        assert found is not None and found.signal == culprit.STACKS and found.lines()[0].endswith("(from the stacks):")
        assert "signal" in found.to_wire() and "seq" not in found.to_wire()
    assert find_culprits({}, NODES, HOSTS, flights={0: WAITS, 1: WAITS}) is None  # every rank in it


def test_recorders_this_torch_cannot_read_are_said_beside_the_stacks_never_a_wrong_culprit():
    """NCCL ranks on a torch without NCCL's dump: the stacks name the rank,
    and the message and the record say why the recorders could not."""
    note = "the nccl Flight Recorder: this torch has no _dump_nccl_trace_json"
    unread = {r: FlightSummary(UNSUPPORTED, recorder="nccl", note=note) for r in range(4)}
    stacks = {0: IN_ALL_REDUCE, 1: IN_ALL_REDUCE, 2: IN_ALL_REDUCE, 3: SLEEPING}
    found = find_culprits(stacks, NODES, HOSTS, flights=unread)
    assert found is not None and found.signal == culprit.STACKS and [s.rank for s in found.suspects] == [3]
    assert found.lines()[-1] == "  (not from torch's Flight Recorder: %s on ranks 0-3)" % note
    assert found.to_wire()["unread"] == "%s on ranks 0-3" % note
    assert find_culprits({r: SLEEPING for r in range(4)}, NODES, HOSTS, flights=unread) is None
    read = find_culprits(stacks, NODES, HOSTS, flights={r: WAITS for r in range(3)})
    assert read is not None and "unread" not in read.to_wire()
