"""Progress on the wire and on the control (gang_progress.py): a node's ranks
summed up for its heartbeat, the gang's view, its line and its stragglers, each
afresh at a restart or a swap; hang_timeout's clock, the card's section."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.gang import messages as msg
from metaflow_extensions.torchrun.plugins.torchrun.gang.calls import CallBook
from metaflow_extensions.torchrun.plugins.torchrun.gang.gang_progress import (
    CHART_GROUPS, CHART_SAMPLES, SIGNAL_CPU, SIGNAL_GPU, SIGNAL_PROGRESS, NodeProgress, ProgressBook,
    ProgressTracker, duration)
from metaflow_extensions.torchrun.plugins.torchrun.gang.wire import ProtocolError
from metaflow_extensions.torchrun.plugins.torchrun.procs.rank_progress import ProgressReport
from metaflow_extensions.torchrun.plugins.torchrun.procs.records import write_json
from metaflow_extensions.torchrun.plugins.torchrun.procs.status import RankStatus
from metaflow_extensions.torchrun.plugins.torchrun.card import progress as card_progress
from metaflow_extensions.torchrun.plugins.torchrun.card.text import clip


def _node(rate, step=100, lo=0, hi=7, total=1000, cpu=None, **metrics):
    return NodeProgress(ranks=hi - lo + 1, step_min=step, step_median=step, step_max=step, total=total,
                        rate=rate, rate_min=rate, slowest_rank=lo, rank_lo=lo, rank_hi=hi, stalled=0.5, cpu=cpu,
                        metrics=metrics)


# -- the wire -------------------------------------------------------------------------


def test_a_heartbeat_carries_a_node_s_progress_and_it_reads_back():
    beat = msg.Heartbeat(quiet=1.5, progress=_node(2.0, loss=0.25))
    back = msg.parse(json.loads(json.dumps(beat.to_wire())))
    assert back == beat and back.progress.metrics == {"loss": 0.25}
    assert msg.parse({"type": "hb"}) == msg.Heartbeat()


@pytest.mark.parametrize("bad", [
    {"step_min": -1}, {"step_min": 5, "step_median": 3}, {"rate": float("inf")}, {"rate": "fast"},
    {"ranks": True}, {"metrics": {"x" * 41: 1.0}}, {"metrics": {"m%d" % i: 1.0 for i in range(9)}},
    {"metrics": {"loss": "low"}}, {"metrics": [1]}, {"stalled": -1}, {"total": 2**60}, "progress",
    {"gpu": 100.5}, {"gpu": -1}, {"gpu": "busy"}, {"gpu": True}, {"gpu": float("nan")},
])
def test_a_hostile_progress_is_a_protocol_error(bad):
    wire = _node(1.0).to_wire()
    progress = {**wire, **bad} if isinstance(bad, dict) else bad
    with pytest.raises(ProtocolError):
        msg.parse({"type": "hb", "progress": progress})


def test_a_node_s_record_stays_small_whatever_its_ranks():
    wire = json.dumps(msg.Heartbeat(0.1, _node(1.0, lo=0, hi=4095, **{"m%d" % i: 1e300 for i in range(8)})).to_wire())
    assert len(wire) < 600


# -- on the node ---------------------------------------------------------------------


def test_the_tracker_sums_up_the_node_s_ranks(tmp_path):
    clock = [100.0]
    tracker = ProgressTracker(str(tmp_path), clock=lambda: clock[0])
    assert tracker.sample() is None  # nothing reported, no rank to measure
    for second in range(4):
        for rank, pace in ((4, 10), (5, 10), (6, 2)):
            write_json(str(tmp_path / ("rank-%d.progress.json" % rank)),
                       ProgressReport(rank, pace * second, 100, {"loss": float(rank)}, 1000.0 + second).to_wire())
        clock[0] += 1.0
        node = tracker.sample()
    assert (node.ranks, node.step_min, node.step_median, node.step_max) == (3, 6, 30, 30)
    assert node.rate == 10.0 and node.rate_min == 2.0 and node.slowest_rank == 6
    assert (node.rank_lo, node.rank_hi, node.total) == (4, 6, 100)
    assert node.metrics == {"loss": 5.0} and node.stalled == 0.0
    clock[0] += 7.0  # no rank advanced since
    assert tracker.sample().stalled == 7.0


def _report(tmp_path, rank, step, at, start=0):
    write_json(str(tmp_path / ("rank-%d.progress.json" % rank)),
               ProgressReport(rank, step, 100, {}, at, start=start).to_wire())


def _status(tmp_path, rank, restart, pid=-1):
    write_json(str(tmp_path / ("rank-%d.status.json" % rank)),
               RankStatus(rank=rank, local_rank=rank, restart=restart, pid=pid).to_wire())


def test_after_a_restart_a_rank_s_rate_counts_from_its_new_start_only(tmp_path):
    """Was: the replaced ranks' files and each rank's history outlived the restart; the new ranks'
    steps/s were measured from the old ranks' last report (the time down included), a curve rising
    from 0 for the 30 s window while a swapped-in spare, with no history, looked fast."""
    clock = [0.0]
    tracker = ProgressTracker(str(tmp_path), clock=lambda: clock[0])
    for second in range(4):  # the first start: 10 steps/s
        _report(tmp_path, 0, 10 * second, 1000.0 + second)
        _report(tmp_path, 1, 10 * second, 1000.0 + second)
        clock[0] += 1.0
        assert tracker.sample().start == 0
    # Rank 0 of restart 1 started (its status) and reports, from its checkpoint, 8 s later;
    # rank 1's file is still the replaced rank's.
    _status(tmp_path, 0, 1)
    node = None
    for second in range(3):
        _report(tmp_path, 0, 25 + 10 * second, 1012.0 + second, start=1)
        clock[0] += 1.0
        node = tracker.sample()
    assert node.start == 1 and node.ranks == 1 and (node.rank_lo, node.rank_hi) == (0, 0)
    assert node.rate == node.rate_min == 10.0 and node.step_median == 45
    # Its step gone back within one start (the script resumed from an older checkpoint): afresh too.
    for second in range(2):
        _report(tmp_path, 0, 5 + 10 * second, 1020.0 + second, start=1)
        clock[0] += 1.0
        node = tracker.sample()
    assert node.rate == 10.0


def test_before_the_new_ranks_report_a_node_says_which_start_it_is_in(tmp_path):
    tracker = ProgressTracker(str(tmp_path), gpu=lambda: 50.0)
    _report(tmp_path, 0, 30, 1000.0)
    _status(tmp_path, 0, 2)  # restart 2's rank started, and reported nothing yet
    node = tracker.sample()
    assert node.start == 2 and not node.reporting and node.gpu == 50.0
    back = msg.parse(json.loads(json.dumps(msg.Heartbeat(None, node).to_wire()))).progress
    assert back.start == 2
    assert "start" not in json.dumps(msg.Heartbeat(None, _node(1.0)).to_wire())  # the first start's: as before


def _even(book, at, start=0, rate=2.0, nodes=(0, 1, 2, 3)):
    for node in nodes:
        book.update(node, "h%d" % node, replace(_node(rate, lo=2 * node, hi=2 * node + 1), start=start))
    return book.check(at)


def test_a_restart_starts_the_gang_s_rates_and_its_naming_again():
    book = _book(ratio=1.5, window=10.0)
    for second in range(20):
        assert _even(book, float(second)) == []
    assert book.summary.steps_per_second == 2.0 and book.settled
    # The restart: node 0's new ranks report first, at a pace of their own; the others' last
    # reports of the replaced start, still in flight, are left aside.
    _even(book, 20.0, start=1, rate=4.0, nodes=(0,))
    _even(book, 21.0, start=0, rate=0.1, nodes=(1, 2, 3))
    assert set(book.nodes) == {0} and book.summary.steps_per_second == 4.0
    assert book.summary.eta_seconds == round((1000 - 100) / 4.0, 1)  # from the rates since the restart
    # Node 3 slower at first (its ranks rejoined a step later): not named before the start's own window.
    for second in range(22, 29):
        _even(book, float(second), start=1, rate=4.0, nodes=(0, 1, 2))
        book.update(3, "h3", replace(_node(3.0, lo=6, hi=7), start=1))
        assert book.check(float(second) + 0.5) == []
        assert book.summary.slowest is None and "slowest" not in book.line()
    _even(book, 31.0, start=1, rate=4.0, nodes=(0, 1, 2))
    assert book.summary.slowest is not None and book.summary.slowest["node_index"] == 3  # its window had come


def test_after_a_restart_no_line_says_the_replaced_ranks_step_and_the_rate_says_it_is_measured_again():
    """The control's sum lags the ranks by up to a heartbeat, and a line it had not said yet was said after
    the restart: `progress: step 51/200 (26%), ETA 15 s` 0.9 s after `resumed at step 81`. Then the new
    start's first line dropped ETA and steps/s without a word."""
    from metaflow_extensions.torchrun.plugins.torchrun.gang.config import GangConfig
    from metaflow_extensions.torchrun.plugins.torchrun.gang.speaker import Speaker

    said = []
    book = _book(nodes=2)
    speaker = Speaker(GangConfig("g", 2, heartbeat_timeout=30.0, progress_interval=15.0), 0.0, said.append)
    for node in (0, 1):
        book.update(node, "h%d" % node, _node(10.0, step=21, lo=2 * node, hi=2 * node + 1, total=200))
    speaker.tick(15.0, book, lambda: None)
    assert said == ["progress: step 21/200 (10%), ETA 18 s, 10 steps/s"]
    for node in (0, 1):  # summed up, not said yet (the interval), when the ranks fail at step 85
        book.update(node, "h%d" % node, _node(10.0, step=51, lo=2 * node, hi=2 * node + 1, total=200))
    speaker.tick(20.0, book, lambda: None)
    book.restarted(1)  # the gang's restart (gang/handlers.py), before any node's new ranks report
    book.update(0, "h0", _node(10.0, step=85, total=200))  # the replaced ranks' last heartbeat, late
    speaker.tick(31.0, book, lambda: None)
    assert said[1:] == [] and book.current().step is None
    for node in (0, 1):  # the new ranks resumed at 81: a report or two, no rate yet
        book.update(node, "h%d" % node, replace(_node(None, step=82, lo=2 * node, hi=2 * node + 1, total=200),
                                                start=1))
    speaker.tick(47.0, book, lambda: None)
    assert said[1:] == ["progress: step 82/200 (41%), ETA and steps/s measuring..."]
    assert ["ETA", "measuring..."] in card_progress.rows(book.summary, clip)
    assert ["steps/s", "measuring..."] in card_progress.rows(book.summary, clip)
    for node in (0, 1):
        book.update(node, "h%d" % node, replace(_node(10.0, step=100, lo=2 * node, hi=2 * node + 1, total=200),
                                                start=1))
    speaker.tick(63.0, book, lambda: None)
    assert said[2:] == ["progress: step 100/200 (50%), ETA 10 s, 10 steps/s"]
    assert not any(row[1] == "measuring..." for row in card_progress.rows(book.summary, clip))


def test_a_straggler_of_the_replaced_start_is_not_counted_into_the_new_one():
    book = _book(ratio=1.5, window=10.0)
    for second in range(8):  # node 2 slow for 8 s of the 10 s window, then the restart
        book.update(2, "h2", _node(0.5))
        _even(book, float(second), nodes=(0, 1, 3))
    for second in range(8, 16):
        book.update(2, "h2", replace(_node(0.5), start=1))
        assert _even(book, float(second), start=1, nodes=(0, 1, 3)) == []
    assert book.summary.stragglers == ()


# -- on the control ---------------------------------------------------------------------


def _book(nodes=4, ratio=1.5, window=10.0):
    return ProgressBook(nodes, ratio, window)


def test_a_slow_node_is_named_once_after_the_window_with_its_ranks():
    book = _book(ratio=1.8, window=20.0)
    named = []
    for second in range(60):
        for node in range(4):
            book.update(node, "host%d" % node, _node(1.0 if node == 2 else 2.0, lo=8 * node, hi=8 * node + 7))
        named += book.check(1000.0 + second)
    assert [n.node_index for n in named] == [2]
    assert named[0].sentence() == "node 2 (host2, ranks 16-23) is 2.0x slower than the median for 20 s"
    record = book.summary
    assert [s.node_index for s in record.stragglers] == [2] and record.stragglers[0].seconds == 59
    assert record.signal == SIGNAL_PROGRESS
    assert json.loads(json.dumps(record.to_wire()))["stragglers"][0] == {
        "node_index": 2, "host": "host2", "ranks": "16-23", "ratio": 2.0, "seconds": 59.0, "signal": SIGNAL_PROGRESS}


def test_a_node_slow_for_less_than_the_window_or_by_less_than_the_ratio_is_not_named():
    book = _book(ratio=1.5, window=10.0)
    named = []
    for second in range(40):
        slow = 1.0 if second % 10 < 5 else 2.0  # slow 5 s at a time
        for node in range(4):
            book.update(node, "h", _node(slow if node == 1 else 2.0 if node != 3 else 1.5))
        named += book.check(float(second))
    assert named == []


def test_without_progress_the_busiest_node_on_cpu_is_named_and_the_signal_said():
    book = _book(ratio=1.5, window=3.0)
    named = []
    for second in range(5):
        for node in range(4):
            book.update(node, "h", NodeProgress(cpu=0.9 if node == 0 else 0.3, rank_lo=None))
        named += book.check(float(second))
    assert [n.node_index for n in named] == [0] and named[0].signal == SIGNAL_CPU
    assert "3.0x busier on CPU than the median" in named[0].sentence()
    assert book.summary.signal == SIGNAL_CPU and book.line() is None  # no step: no progress line


def test_without_progress_on_gpu_nodes_the_idlest_gpus_are_named_and_the_signal_said():
    book = _book(ratio=1.5, window=3.0)
    named = []
    for second in range(5):
        for node in range(4):  # node 2's GPUs wait for its input; CPU would blame node 0
            book.update(node, "h", NodeProgress(cpu=0.9 if node == 0 else 0.3, gpu=30.0 if node == 2 else 90.0))
        named += book.check(float(second))
    assert [n.node_index for n in named] == [2] and named[0].signal == SIGNAL_GPU
    assert "3.0x less busy on GPU than the median" in named[0].sentence()
    assert book.summary.signal == SIGNAL_GPU and book.summary.to_wire()["signal"] == SIGNAL_GPU


@pytest.mark.parametrize("gpus, signal", [
    ((2.0, 2.0, 0.0, 2.0), SIGNAL_GPU),  # idle GPUs gang-wide (median under GPU_IDLE): nothing to compare
    ((None, None, 10.0, None), SIGNAL_CPU),  # one node's answer is no comparison: the CPU signal
])
def test_the_gpu_signal_names_no_one_when_it_cannot_compare(gpus, signal):
    book = _book(ratio=1.5, window=0.0)
    named = []
    for second in range(3):
        for node in range(4):
            book.update(node, "h", NodeProgress(cpu=0.3, gpu=gpus[node]))
        named += book.check(float(second))
    assert named == [] and book.summary.signal == signal


def test_the_tracker_carries_the_gpus_utilisation_with_or_without_reports(tmp_path):
    tracker = ProgressTracker(str(tmp_path), gpu=lambda: 42.5)
    one = tracker.sample()
    assert one is not None and one.gpu == 42.5 and not one.reporting
    assert msg.parse(json.loads(json.dumps(msg.Heartbeat(None, one).to_wire()))).progress.gpu == 42.5
    assert ProgressTracker(str(tmp_path)).sample() is None  # no reports, no CPU seen yet, no GPU


def test_the_line_says_step_percent_eta_rate_metrics_and_the_slowest_node():
    book = _book(nodes=3)
    for node, rate in enumerate((2.0, 2.0, 0.5)):
        book.update(node, "h%d" % node, _node(rate, step=250, lo=2 * node, hi=2 * node + 1, loss=0.5, lr=0.001))
    book.check(0.0)
    assert book.line() == ("progress: step 250/1000 (25%), ETA 6 min, 2 steps/s, loss 0.5, lr 0.001; "
                           "slowest: node 2 (h2, ranks 4-5) at 0.25x the median steps/s")


@pytest.mark.parametrize("rates", [(2.0, 2.0, 2.0, 2.0), (2.0, 2.01, 1.99, 2.0), (2.0, 2.0, 1.85)])
def test_an_even_gang_names_no_slowest_node(rates):
    """Some node is always the slowest; one within 10 % of the median holds nothing up
    (a user saw "slowest: node 1 ... at 1.00x the median steps/s")."""
    book = _book(nodes=len(rates))
    for node, rate in enumerate(rates):
        book.update(node, "h%d" % node, _node(rate, step=250, lo=2 * node, hi=2 * node + 1))
    book.check(0.0)
    assert book.summary.slowest is None
    assert "slowest" not in (book.line() or "") and book.line().startswith("progress: step 250/1000")
    assert not any(row[0] == "slowest node" for row in card_progress.rows(book.summary, clip))


def test_the_chart_stays_the_same_size_at_4096_nodes():
    book = _book(nodes=4096)
    for node in range(4096):
        book.update(node, "h", _node(1.0 + node % 3))
    for second in range(0, 4000, 25):
        book.check(float(second))
    record = book.summary
    assert len(record.chart_groups) == CHART_GROUPS and len(record.chart) <= CHART_SAMPLES
    assert record.chart[-1][0] >= 3000  # the whole call, at a coarser resolution
    assert len(json.dumps(card_progress.chart_spec(record))) < 200_000


def test_a_new_call_counts_afresh_and_keeps_the_stragglers():
    book = _book(window=0.0)
    for node in range(4):
        book.update(node, "h", _node(0.5 if node == 3 else 2.0))
    book.check(0.0)
    book.new_call()
    assert book.nodes == {} and [s.node_index for s in book.summary.stragglers] == [3]


def test_hang_timeout_counts_from_the_last_step_when_ranks_report_progress():
    book = CallBook(2)
    for node in (0, 1):
        book.enter(node, msg.Call(0, "train.py"), {})
    start = book.calls[0].all_entered_at
    cause = book.hung(start + 100, 30.0, lambda n: start + 60, {}, advanced=True)
    assert cause is not None and cause.summary.startswith("no rank advanced a step for 40 s (hang_timeout=30s)")
    assert "no output from any rank" in book.hung(start + 100, 30.0, lambda n: start + 60, {}).summary


def test_durations_read_as_a_person_says_them():
    assert [duration(s) for s in (5, 300, 7500)] == ["5 s", "5 min", "2 h 05 min"]


def test_the_card_section_shows_what_a_rank_sent_as_text():
    """A table cell is drawn as text: what a rank sent goes in as it is,
    clipped; a code span or an entity there would show its backticks or
    ``&lt;`` as typed (issue 52). That a browser shows it as text and runs
    none of it: tests/unit/test_card_hostile.py, this table filled."""
    book = _book(nodes=2, window=0.0)
    book.update(0, "h0", _node(2.0, **{"*loss*": 0.5}))
    book.update(1, "<b>h</b>", _node(0.5))
    book.check(0.0)
    rows = card_progress.rows(book.summary, clip)
    assert ["*loss*", "0.5"] in rows
    assert any("<b>h</b>" in cell for row in rows for cell in row)
    assert rows[0] == ["step", "100 of 1000 (10%)"]


def test_past_16_stragglers_the_rest_are_counted_once_each():
    book = _book(nodes=60, window=0.0)
    named = []
    for second in range(10):
        for node in range(60):
            book.update(node, "h", _node(0.5 if node % 3 == 0 else 2.0))
        named += book.check(float(second))
    assert len(book.summary.stragglers) == 16 and book.summary.stragglers_more == 4
    assert sorted(n.node_index for n in named) == list(range(0, 60, 3))  # each said once; the record lists 16


def test_a_restarts_gap_in_the_reports_names_no_node_busier_on_cpu():
    """A call whose ranks report steps: while a restart's new ranks start (no report yet), a node busy
    starting its ranks is not a straggler by CPU (it was named so in a 3-node flow after a swap)."""
    book = _book(ratio=1.3, window=2.0)
    for second in range(3):
        for node in range(3):
            book.update(node, "h", _node(2.0))
        assert book.check(float(second)) == []
    named = []
    for second in range(3, 10):  # restart 1: the new ranks have not reported; node 2's start is busy
        for node in range(3):
            book.update(node, "h", NodeProgress(cpu=0.9 if node == 2 else 0.3, rank_lo=None, start=1))
        named += book.check(float(second))
    assert named == [] and book.summary.stragglers == ()
