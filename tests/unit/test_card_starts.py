"""Every start of the ranks on the card (card/starts.py, timeline.py, content.py): a restart in place
keeps the replaced start's ranks (this node's in its restart's record, the failing node's in the
gang's view), drawn with the failed rank in the failure's colour and the bystanders stopped; the
Ranks table says each row's start; a rank's last lines say which start wrote them; a refused
restart says why (errors.not_restarted)."""

from __future__ import annotations

import os

import records
from metaflow_extensions.torchrun.plugins.torchrun.card import content, starts, timeline
from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.errors import not_restarted
from metaflow_extensions.torchrun.plugins.torchrun.gang.calls import CallState, begin_restart
from metaflow_extensions.torchrun.plugins.torchrun.gang.messages import NodeReport
from metaflow_extensions.torchrun.plugins.torchrun.procs.status import RankStatus
from metaflow_extensions.torchrun.plugins.torchrun.record.in_step_restarts import (
    InStepRestart, replaced_ranks, split_by_start, start_mark)
from metaflow_extensions.torchrun.plugins.torchrun.record.result import TorchrunResult

T0 = 1_800_000_000.0
KILLED = Cause(CauseKind.RANK_FAILED, "node 1, rank 3: killed by signal SIGKILL", node_index=1, rank=3, exit_code=-9,
               time=T0 + 4)


def _rank(rank, start, code, restart=0, begin=1.0, end=4.0):
    return RankStatus(rank, rank % 2, restart=restart, pid=100 + rank, start=T0 + begin,
                      end=None if end is None else T0 + end, exit_code=code)


def _restarted_result():
    """2 x 2, rank 3 (node 1) SIGKILLed in start 0, every rank back in start 1 and done."""
    final = {str(n): {"ranks": [dict(rank=r, local_rank=r % 2, restart=1, start=T0 + 5, end=T0 + 9, exit_code=0)
                                for r in (2 * n, 2 * n + 1)], "tails": {
        str(2 * n + 1): {"stderr": ["old line", start_mark(1), "new line"]}}} for n in (0, 1)}
    gang = records.gang({"joined_at": {"0": T0, "1": T0}, "finished_at": {"0": T0 + 10, "1": T0 + 10},
                         "reports": final})
    gang.replaced[0] = {1: (_rank(2, 0, 1), _rank(3, 0, -9))}  # node 1's report of its failure
    own = replaced_ranks([_rank(0, 0, None, end=None), _rank(1, 0, -15)])  # node 0's, kept at its restart
    restart = InStepRestart(1, KILLED, ran_from=T0 + 0.5, failed_at=T0 + 4, stopped_at=T0 + 4.5, ranks=own)
    return TorchrunResult(command=[], node_index=0, num_nodes=2, nproc_per_node=2, exit_code=0, started_at=T0,
                          ended_at=T0 + 10, restarts=1, restarts_allowed=2, in_step_restarts=[restart], gang=gang)


def test_a_restart_in_place_draws_the_first_start_with_its_killed_rank_and_the_restart_mark():
    result = _restarted_result()
    spec = timeline.spec(timeline.from_result(result, content.gang_ranks(result)))
    bars = next(layer["data"]["values"] for layer in spec["layer"] if layer["mark"]["type"] == "bar")
    drawn = sorted((b["lane"], b["start"], b["state"]) for b in bars if b["lane"].startswith("rank"))
    assert [(lane, state) for lane, _, state in drawn] == [
        ("rank 0 (node 0)", "rank: stopped"), ("rank 0 (node 0)", "rank: exit 0"),
        ("rank 1 (node 0)", "rank: stopped"), ("rank 1 (node 0)", "rank: exit 0"),
        ("rank 2 (node 1)", "rank: stopped"), ("rank 2 (node 1)", "rank: exit 0"),
        ("rank 3 (node 1)", "rank: failed"), ("rank 3 (node 1)", "rank: exit 0")]
    # Rank 0 of start 0 never wrote its end: drawn to where its restart stopped it.
    first = next(b for b in bars if b["lane"] == "rank 0 (node 0)" and b["state"] == "rank: stopped")
    assert first["end"] == 4.5
    labels = [v["label"] for layer in spec["layer"] if layer["mark"]["type"] == "text" for v in layer["data"]["values"]]
    assert "restart 1: rank 3 (node 1) failed" in labels


def test_without_a_restart_nothing_changes():
    result = _restarted_result()
    result.in_step_restarts.clear()
    result.gang.replaced.clear()
    result.restarts = 0
    for report in result.gang.reports.values():
        object.__setattr__(report, "ranks", tuple(RankStatus(r.rank, r.local_rank, start=r.start, end=r.end,
                                                             exit_code=0) for r in report.ranks))
    assert content.rank_headers(result) == content.RANK_HEADERS
    assert [row[4] for row in content.rank_rows(result)] == ["0 (ok)"] * 4


def test_the_ranks_table_says_each_rows_start_and_what_stopped_a_bystander():
    result = _restarted_result()
    assert content.rank_headers(result)[2] == "start"
    rows = {(row[0], row[2]): row for row in content.rank_rows(result)}
    assert len(rows) == 8
    assert rows[("3", "0 (replaced by restart 1)")][5] == "killed by signal SIGKILL"
    assert rows[("1", "0 (replaced by restart 1)")][5] == "killed by signal SIGTERM (a bystander of restart 1's failure)"
    assert rows[("0", "0 (replaced by restart 1)")][5] == "stopped by restart 1 (no exit recorded)"
    assert rows[("3", "1 (the last)")][5] == "0 (ok)"


def test_last_lines_say_which_start_wrote_them():
    result = _restarted_result()
    sources = [p.source if hasattr(p, "source") else str(p) for p in content.tail_parts(result, _Md)]
    assert any("rank 3 (node 1) stderr, start 0 (replaced by restart 1)" in s for s in sources), sources
    assert any("rank 3 (node 1) stderr, start 1 (the last)" in s for s in sources), sources


class _Md:
    def __init__(self, source):
        self.source = source


def test_the_summary_names_the_restart_and_topology_counts_used_of_allowed():
    result = _restarted_result()
    summary = content.summary_markdown(result, "F", "F/1/train/2")
    assert "after 1 in-step restart (restart 1: node 1, rank 3: killed by signal SIGKILL)" in summary, summary
    assert dict(content.topology_rows(result, "gloo"))["restarts"] == "1 used of 2 allowed"
    result.restarts_allowed = result.restarts = 0
    assert dict(content.topology_rows(result, "gloo"))["restarts"] == "none allowed (@torchrun(restarts=0))"


def test_lines_split_at_each_restarts_mark():
    lines = ["a", start_mark(1), "b", start_mark(2), "c"]
    assert split_by_start(lines, 2) == [(0, ["a"]), (1, ["b"]), (2, ["c"])]
    assert split_by_start(["x"], 3) == [(3, ["x"])]
    # A line that only looks like a mark elsewhere in it is a line.
    assert split_by_start(["say " + start_mark(1)], 0) == [(0, ["say " + start_mark(1)])]


def test_the_gang_keeps_the_replaced_starts_ranks_of_the_nodes_that_reported_it():
    state = CallState(0)
    state.reports[1] = NodeReport(ranks=(_rank(2, 0, 1), _rank(3, 0, -9)))
    state.reports[0] = NodeReport(ranks=(_rank(0, 0, 0, restart=0),))
    begin_restart(state, 1234)
    assert sorted(state.replaced[0]) == [0, 1] and [r.rank for r in state.replaced[0][1]] == [2, 3]
    # Restart 2: node 1's report is still start 0's, node 0 reported start 1's failure.
    state.reports[0] = NodeReport(ranks=(_rank(0, 1, -9, restart=1),))
    begin_restart(state, 1235)
    assert sorted(state.replaced[1]) == [0]


def test_a_refused_restart_says_why():
    bug = Cause(CauseKind.RANK_FAILED, "node 1, rank 1: KeyError: 'x'", node_index=1, rank=1, exc_type="KeyError",
                message="'x'", traceback='Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n'
                                         "KeyError: 'x'")
    said = not_restarted(bug, 2, 0)
    assert said.startswith("not restarted: a Python exception of your code (KeyError")
    assert said.endswith("@torchrun(restarts=2) restarts only infrastructure failures")
    assert not_restarted(bug, 0, 0) == ""  # none asked for
    assert not_restarted(KILLED, 1, 1) == "not restarted: @torchrun(restarts=1) used all 1 of its restarts"
    lost = Cause(CauseKind.NODE_LOST, "node 1 lost", node_index=1)
    assert "only while every node's task is alive" in not_restarted(lost, 2, 0)


def test_a_swapped_out_nodes_killed_ranks_are_the_failure_not_bystanders():
    result = _restarted_result()
    # Node 1 taken out: its last report is of start 0, where its rank 3 was killed.
    result.gang.reports[1] = NodeReport(ranks=(_rank(2, 0, -9), _rank(3, 0, -9)))
    runs = {(r.node, r.rank, r.start): r.state for r in starts.rank_runs(result)}
    assert runs[(1, 3, 0)] == "rank: failed" and runs[(1, 2, 0)] == "rank: stopped"


def test_a_start_known_for_some_nodes_only_says_so():
    result = _restarted_result()
    assert not timeline.captions(timeline.from_result(result, content.gang_ranks(result)))
    result.gang.replaced.clear()  # node 1's failure report of start 0 not kept
    notes = timeline.captions(timeline.from_result(result, content.gang_ranks(result)))
    assert notes == ["start 0 is drawn for node 0 only (a node that did not fail keeps its own on its card)"]


def test_a_restart_keeps_this_nodes_replaced_ranks_and_marks_their_logs(tmp_path):
    from metaflow_extensions.torchrun.plugins.torchrun.gang import messages as msg
    from metaflow_extensions.torchrun.plugins.torchrun.procs.names import rank_log_path
    from metaflow_extensions.torchrun.plugins.torchrun.runtime.restarts import CallRestarts

    log = rank_log_path(str(tmp_path), 3, "stderr")
    with open(log, "w") as f:
        f.write("Traceback: the first start's\n")
    restarts = CallRestarts()
    restarts.begin(msg.Restart(0, 1, 29500, KILLED), T0, T0 + 4.5, [T0 + 1], [_rank(2, 0, 1), _rank(3, 0, -9)],
                   str(tmp_path))
    assert [r.rank for r in restarts.records[0].ranks] == [2, 3]
    with open(log) as f:
        lines = f.read().splitlines()
    assert split_by_start(lines + ["the second start's"], 1) == [
        (0, ["Traceback: the first start's"]), (1, ["the second start's"])]
    assert not os.path.exists(rank_log_path(str(tmp_path), 2, "stdout"))  # none made where the rank wrote nothing


def test_a_node_the_gang_waited_for_is_marked_where_it_began():
    import dataclasses

    from metaflow_extensions.torchrun.plugins.torchrun.gang.gang_progress import ProgressRecord, Straggler

    late = Straggler(1, "host<b>", "2-3", 1.24, 30.0, "arrival", 0.9, 24.4, T0 + 3)
    by_steps = Straggler(1, "host", "2-3", 1.6, 300.0, "progress reports (steps/s of each node's slowest rank)")
    result = dataclasses.replace(_restarted_result(), progress=ProgressRecord(stragglers=(late, by_steps)))
    spec = timeline.spec(timeline.from_result(result, content.gang_ranks(result)))
    marks = [v for layer in spec["layer"] if layer["mark"]["type"] == "text" for v in layer["data"]["values"]
             if "late" in v["label"]]
    assert marks == [{"at": 3.0, "label": "node 1 late (ranks 2-3): 24 ms a second"}]  # the host never in it
