"""The rank that holds up a collective is named, by rank, node and host, before
where the ranks were (issue 39). A real gang's hang: tests/integration/test_stops.py."""

from __future__ import annotations

from metaflow_extensions.torchrun.plugins.torchrun.errors import GangAborted
from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.procs import culprit, failure_block
from metaflow_extensions.torchrun.plugins.torchrun.procs.culprit import collective, find_culprits

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
        "Suspected cause: rank 3 is not in the all_reduce that ranks 0-2 wait in:",
        "  rank 3 (node 1, host-b): /work/train.py:10 in <module>",
    ]
    assert found.to_wire()["suspects"][0] == {"rank": 3, "node": 1, "host": "host-b",
                                              "where": "/work/train.py:10 in <module>"}


def test_a_rank_in_another_collective_or_without_a_stack_is_a_suspect_too():
    found = find_culprits({0: IN_ALL_REDUCE, 1: IN_BARRIER, 2: IN_ALL_REDUCE}, NODES, HOSTS, ranks=(0, 1, 2, 3))
    assert found is not None
    assert [(s.rank, s.where) for s in found.suspects] == [
        (1, "/work/train.py:12 in <module>"), (3, culprit.NO_STACK)]
    assert found.lines()[0] == "Suspected cause: 2 ranks are not in the all_reduce that ranks 0, 2 wait in:"


def test_nothing_is_claimed_without_a_rank_in_a_collective_or_one_outside_it():
    assert find_culprits({0: SLEEPING, 1: SLEEPING}, NODES, HOSTS) is None
    assert find_culprits({r: IN_ALL_REDUCE for r in range(4)}, NODES, HOSTS) is None


def test_many_suspects_are_counted_not_listed():
    stacks = {0: IN_ALL_REDUCE, **{r: SLEEPING for r in range(1, 4000)}}
    found = find_culprits(stacks, {}, {})
    assert found is not None and len(found.suspects) == culprit.NAMED and found.more == 3999 - culprit.NAMED
    assert found.lines()[0] == "Suspected cause: 3999 ranks are not in the all_reduce that rank 0 waits in:"
    assert found.lines()[1] == "  rank 1 (node ?, ?): /work/train.py:10 in <module>"
    assert found.lines()[-1] == "  ... and %d more ranks" % (3999 - culprit.NAMED)


def test_the_suspects_come_before_where_the_ranks_were():
    stacks = {0: IN_ALL_REDUCE, 1: IN_ALL_REDUCE, 2: IN_ALL_REDUCE, 3: SLEEPING}
    found = find_culprits(stacks, NODES, HOSTS)
    assert found is not None
    cause = Cause(CauseKind.HANG, "no output from any rank for 10 s (hang_timeout=10s)")
    text = str(GangAborted(0, cause, stacks=stacks, suspects=found.lines()))
    assert text.index("Suspected cause: rank 3") < text.index("rank 3 (node 1, host-b)") < text.index("Where the")
    block = failure_block.render(failure_block.Block(stacks=stacks, suspects=found.lines()))
    assert block.splitlines()[0].startswith("Suspected cause")
