"""The gang's recovery policy as a table (gang/recovery.py): every event under every option (spares,
min_nodes, regrow, swap_stragglers, restarts left, node 0 or a worker) against the row of TABLE it falls
under, with no socket; and docs/resume.md's table of what is restarted and what ends the attempt, checked
against the same policy cell by cell."""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
from typing import Dict, List, Tuple

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.gang import recovery as r
from metaflow_extensions.torchrun.plugins.torchrun.gang.bench import Bench

NODES = 3  # with a spare: nodes 0 and 1 train, node 2 waits
RESTARTS = 2
TB = 'Traceback (most recent call last):\n  File "/home/u/train.py", line 88, in <module>\n    x()\n'
SUMMARY = "node %d: %s"


def _cause(kind, node, what, **kw):
    return Cause(kind, SUMMARY % (node, what), node_index=node, call=0, **kw)


# Each event as it happens to ``node`` (0, or worker 1): what the service hears or finds.
EVENTS = {
    "a rank killed": lambda n: r.Failed(_cause(CauseKind.RANK_FAILED, n, "killed", exc_type="killed by signal SIGKILL",
                                               exit_code=-9)),
    "a bug": lambda n: r.Failed(_cause(CauseKind.RANK_FAILED, n, "raised", exc_type="ValueError", traceback=TB)),
    "a hang": lambda n: r.Failed(Cause(CauseKind.HANG, "no output for 9 s", call=0)),
    "the step raised": lambda n: r.Failed(_cause(CauseKind.STEP_FAILED, n, "ended its step with an error")),
    "a node lost": lambda n: r.Dropped(n, _cause(CauseKind.NODE_LOST, n, "disconnected")),
    "node 2 lost": lambda n: r.Dropped(2, _cause(CauseKind.NODE_LOST, 2, "disconnected")),
    "a node silent": lambda n: r.Silent(_cause(CauseKind.UNRESPONSIVE, n, "sent no heartbeat")),
    "two nodes silent": lambda n: r.Silent(_cause(CauseKind.UNRESPONSIVE, 1, "silent", missing=(1, 2))),
    "the control cut off": lambda n: r.Silent(Cause(CauseKind.UNRESPONSIVE, "lost contact", missing=(1, 2))),
    "SIGTERM": lambda n: r.ToldToGo(_cause(CauseKind.PREEMPTED, n, "told", exc_type="SIGTERM", grace=30.0)),
    "a spot notice": lambda n: r.ToldToGo(_cause(CauseKind.PREEMPTED, n, "notice", message="2026-01-01T00:00:00Z",
                                                 grace=30.0)),
    "Ctrl-C": lambda n: r.ToldToGo(_cause(CauseKind.PREEMPTED, n, "told", exc_type="KeyboardInterrupt", grace=30.0)),
    "@timeout": lambda n: r.ToldToGo(_cause(CauseKind.PREEMPTED, n, "told", exc_type="TimeoutException", grace=30.0)),
    "a node back": lambda n: r.Back(n),
    "a node back unfit": lambda n: r.BackUnfit(n, _cause(CauseKind.PREFLIGHT, n, "differs")),
    "a straggler": lambda n: r.Straggler(n, 100.0, _cause(CauseKind.STRAGGLER, n, "waited for")),
    "every node saved": lambda n: r.AllSaved(),
    "preflight: unfit": lambda n: r.Preflight(_cause(CauseKind.PREFLIGHT, n, "torch differs"), unfit=(n,)),
    "preflight: fit": lambda n: r.Preflight(None),
}
OPTIONS = ("spares", "min_nodes", "regrow", "swap_stragglers", "left", "node0")
VALUES = {"spares": (0, 1), "min_nodes": (None, 2), "regrow": (True, False), "swap_stragglers": (None, 60.0),
          "left": (True, False), "node0": (False, True)}

# What happens, the first row whose conditions hold (an option not named: any value). "left": restarts left.
TABLE: List[Tuple[str, Dict[str, object], str]] = [
    ("a rank killed", {"left": False}, "end"),
    ("a rank killed", {"node0": True}, "restart in place"),  # node 0 hosts the store: never swapped
    ("a rank killed", {"spares": 1}, "swap"),
    ("a rank killed", {}, "restart in place"),
    ("a bug", {}, "end"),  # it would raise again
    ("a hang", {"left": False}, "end"),
    ("a hang", {}, "restart in place"),  # pinned to no node
    ("the step raised", {}, "end"),
    ("a node lost", {"node0": True}, "end"),
    ("a node lost", {"spares": 0, "min_nodes": None}, "end"),
    ("a node lost", {"left": False}, "end"),
    ("a node lost", {"spares": 1}, "swap, lost"),  # a spare first
    ("a node lost", {}, "shrink, lost"),  # then min_nodes
    ("node 2 lost", {"spares": 1}, "bench, lost"),  # the spare itself: off the bench
    ("node 2 lost", {"min_nodes": None}, "end"),
    ("node 2 lost", {"left": False}, "end"),
    ("node 2 lost", {}, "shrink, lost"),
    ("a node silent", {"node0": True}, "end"),
    ("a node silent", {"spares": 0, "min_nodes": None}, "end"),
    ("a node silent", {"left": False}, "end"),
    ("a node silent", {"spares": 1}, "swap, cut off"),  # as a lost one, its processes killed where reachable
    ("a node silent", {}, "shrink, cut off"),
    ("two nodes silent", {}, "end"),
    ("the control cut off", {}, "end"),
    ("SIGTERM", {"node0": True}, "end"),  # the control told to stop: the gang stops, every node's grace
    ("SIGTERM", {"spares": 0, "min_nodes": None}, "end"),  # today's graceful stop
    ("SIGTERM", {"left": False}, "end"),
    ("SIGTERM", {"spares": 1}, "swap, departs"),
    ("SIGTERM", {}, "shrink, departs"),
    ("a spot notice", {"node0": True}, "end"),
    ("a spot notice", {"spares": 0, "min_nodes": None}, "end"),
    ("a spot notice", {"left": False}, "end"),
    ("a spot notice", {"spares": 1}, "swap, departs"),
    ("a spot notice", {}, "shrink, departs"),
    ("Ctrl-C", {}, "end"),  # the step told to stop, on every node
    ("@timeout", {}, "end"),
    ("a node back", {}, "bench"),  # a spare now
    ("a node back unfit", {}, "bench"),  # out for good
    ("a straggler", {"swap_stragglers": None}, "nothing"),
    ("a straggler", {"node0": True}, "nothing"),
    ("a straggler", {"spares": 0}, "nothing"),
    ("a straggler", {"left": False}, "nothing"),  # a straggler never ends the gang
    ("a straggler", {}, "swap"),
    ("every node saved", {"regrow": False}, "nothing"),
    ("every node saved", {"left": False}, "nothing"),
    ("every node saved", {"spares": 0, "min_nodes": 2}, "regrow"),  # the node back grows the gang at a snapshot
    ("every node saved", {}, "nothing"),  # nobody waits to come back in
    ("preflight: unfit", {"node0": True}, "end"),
    ("preflight: unfit", {"spares": 0}, "end"),
    ("preflight: unfit", {}, "bench"),  # out, a spare in, before any rank started
    ("preflight: fit", {}, "nothing"),
]


def state_for(event: str, options: Dict[str, object], restart: int = 0) -> r.GangState:
    """The gang of 3 in call 0, every node there and none done; with ``left`` False its restarts are used.
    For "every node saved": after a loss the gang trained on smaller and the node is back, a spare."""
    spares, min_nodes = options["spares"], options["min_nodes"]
    bench = Bench.initial(NODES, spares)  # type: ignore[arg-type]
    if event == "every node saved" and min_nodes and not spares:
        bench = Bench((2,), ())
    used = restart if options["left"] else RESTARTS
    return r.GangState(NODES, RESTARTS, bench, r.CallNow(0, used), spares, min_nodes,  # type: ignore[arg-type]
                       options["regrow"], True, options["swap_stragglers"], {})  # type: ignore[arg-type]


def label(decision: r.Decision) -> str:
    if isinstance(decision, r.Nothing):
        return "nothing"
    if isinstance(decision, r.End):
        return "end"
    how = decision.how.value if isinstance(decision, r.Restart) else "bench"
    if isinstance(decision, r.Restart) and decision.how is r.How.IN_PLACE:
        how = "restart in place"
    return how if decision.out is None else "%s, %s" % (how, decision.out.value)


def expected(event: str, options: Dict[str, object]) -> str:
    for row_event, when, then in TABLE:
        if row_event == event and all(options[k] == v for k, v in when.items()):
            return then
    raise AssertionError("no row for %s under %s" % (event, options))


def combinations():
    for values in itertools.product(*(VALUES[o] for o in OPTIONS)):
        yield dict(zip(OPTIONS, values))


@pytest.mark.parametrize("event", sorted(EVENTS))
def test_every_event_under_every_option_does_what_the_table_says(event):
    wrong = []
    for options in combinations():
        node = 0 if options["node0"] else 1
        got = label(r.decide(EVENTS[event](node), state_for(event, options)))
        if got != expected(event, options):
            wrong.append("%s: %s, the table says %s" % (options, got, expected(event, options)))
    assert not wrong, "\n".join(wrong)


def test_every_row_of_the_table_is_reached_and_every_event_has_rows():
    reached = {expected(e, o) + " " + e for e in EVENTS for o in combinations()}
    rows = {then + " " + event for event, _, then in TABLE}
    assert rows == reached
    assert {event for event, _, _ in TABLE} == set(EVENTS)
    for i, (event, when, then) in enumerate(TABLE):  # no row is shadowed by an earlier one
        assert any(all(o[k] == v for k, v in when.items()) and expected(event, o) == then
                   and _first_row(event, o) == i for o in combinations()), TABLE[i]


def _first_row(event, options):
    return next(i for i, (e, when, _) in enumerate(TABLE)
                if e == event and all(options[k] == v for k, v in when.items()))


def test_a_swap_and_a_shrink_name_the_node_taken_out_and_say_how_many_train_on():
    worker = {"spares": 0, "min_nodes": 2, "regrow": True, "swap_stragglers": None, "left": True, "node0": False}
    shrunk = r.decide(EVENTS["a node silent"](1), state_for("a node silent", worker))
    assert isinstance(shrunk, r.Restart) and shrunk.bench == Bench((), (1,)) and shrunk.swapped_in is None
    assert shrunk.cause.summary == "node 1: sent no heartbeat; the gang trains on without it, on 2 nodes"
    assert shrunk.cause.kind is CauseKind.UNRESPONSIVE and shrunk.cause.node_index == 1 and shrunk.call == 0
    swapped = r.decide(EVENTS["SIGTERM"](1), state_for("SIGTERM", dict(worker, spares=1, min_nodes=None)))
    assert isinstance(swapped, r.Restart) and swapped.bench == Bench((), (1,)) and swapped.swapped_in == 2
    assert swapped.cause.grace == 30.0 and swapped.cause.summary == "node 1: told"  # every node's grace, said as is
    grown = r.decide(r.AllSaved(), r.GangState(NODES, RESTARTS, Bench((2,), ()), r.CallNow(0, 1), min_nodes=2,
                                              hosts={2: "host-c"}))
    assert isinstance(grown, r.Restart) and grown.cause.summary == "node 2 (host-c) back: the gang grows to 3 " \
        "nodes again" and grown.cause.kind is CauseKind.REGROWN and grown.bench == Bench()


def test_a_restart_of_another_cause_grows_the_gang_back_and_a_loss_waits_for_a_call_in_progress():
    back = r.GangState(NODES, RESTARTS, Bench((2,), ()), r.CallNow(0, 1), min_nodes=2)
    regrown = r.decide(EVENTS["a hang"](1), back)
    assert isinstance(regrown, r.Restart) and regrown.how is r.How.REGROW and regrown.bench == Bench()
    kept = r.decide(EVENTS["a hang"](1), dataclasses.replace(back, regrow=False))
    assert isinstance(kept, r.Restart) and kept.how is r.How.IN_PLACE and kept.bench == back.bench
    # Not every node reached the call, or every active node is done with it: the loss ends the gang.
    for call in (r.CallNow(0, reached=False), r.CallNow(0, done=3), None):
        lost = r.decide(EVENTS["a node lost"](1), r.GangState(NODES, RESTARTS, call=call, min_nodes=2))
        assert isinstance(lost, r.End), call


def test_on_aws_batch_nothing_goes_on_without_a_node():
    """Batch starts no node again and Metaflow's control fails a step that lacks one."""
    batch = r.GangState(NODES, RESTARTS, Bench.initial(NODES, 1), r.CallNow(0), spares=1, survives_loss=False)
    for event in ("a node lost", "a node silent", "SIGTERM", "a spot notice"):
        assert isinstance(r.decide(EVENTS[event](1), batch), r.End), event


# -- docs/resume.md's table, cell by cell --------------------------------------------------------------

RESUME = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "resume.md")
# The doc's first cell of a row -> the event of TABLE it stands for.
DOC_ROWS = {
    "a rank killed by a signal (SIGKILL, the OOM killer, SIGSEGV), an exit code without a Python exception, "
    "a NCCL or gloo error, an echo of another node's failure": "a rank killed",
    "`hang_timeout`": "a hang",
    "a Python exception of your code": "a bug",
    "the step's own code raising": "the step raised",
    "a node's task lost (its connection closed: the task killed, the pod deleted)": "a node lost",
    "a node silent for `heartbeat_timeout` (frozen, its host or its link gone)": "a node silent",
    "several nodes silent at once, or the control cut off from all": "two nodes silent",
    "a worker told to go (SIGTERM to its task, its spot termination notice)": "SIGTERM",
    "the step told to stop (Ctrl-C, `@timeout`), or the control told to go": "Ctrl-C",
    "node 0 lost or silent": "a node lost",
    "a straggler named for `swap_stragglers` seconds": "a straggler",
    "a lost node's task back": "a node back",
    "every training node saved a snapshot since the restart, a node back waiting": "every node saved",
}
# Each column's options: restarts left, a worker (node 0 in the row that says so).
COLUMNS = [dict(spares=0, min_nodes=None), dict(spares=1, min_nodes=None), dict(spares=0, min_nodes=2)]
# How the doc words each answer: a cell begins with these words.
WORDS = {"restart in place": "restarted", "swap": "swapped for a spare", "shrink": "trains on without it",
         "regrow": "grows back", "end": "ends the attempt", "nothing": "nothing changes", "bench": "a spare"}


def _doc_table() -> Dict[str, List[str]]:
    with open(RESUME, encoding="utf-8") as f:
        text = f.read()
    head = text.index("| what happened | `restarts=N` |")
    rows = {}
    for line in text[head:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        rows[cells[0]] = cells[1:]
    return rows


def test_docs_resume_table_says_what_the_policy_does():
    rows = _doc_table()
    assert set(rows) == set(DOC_ROWS), "the doc's rows and the test's differ"
    wrong = []
    for first, cells in rows.items():
        event = DOC_ROWS[first]
        for column, cell in zip(COLUMNS, cells):
            options = dict(column, regrow=True, swap_stragglers=60.0, left=True, node0=first.startswith("node 0"))
            node = 0 if options["node0"] else 1
            said = WORDS[re.sub(r", .*", "", label(r.decide(EVENTS[event](node), state_for(event, options))))]
            if not cell.startswith(said):
                wrong.append("%s | %s: the policy says %r" % (first, cell, said))
    assert not wrong, "\n".join(wrong)
