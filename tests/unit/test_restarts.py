"""@torchrun(restarts=N) below the flows: the service decides a restart in one
place and tells every node (real servers and clients on 127.0.0.1); what may
be restarted (the classification retry_on uses); the option's checks; the
record of each restart."""

from __future__ import annotations

import os
import time

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from gang_net import GUARD, enter_everywhere, wait_cause
from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind, restartable_in_step
from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunInvalidArgument
from metaflow_extensions.torchrun.plugins.torchrun.gang import calls as gang_calls
from metaflow_extensions.torchrun.plugins.torchrun.gang.calls import CallState
from metaflow_extensions.torchrun.plugins.torchrun.launch.inputs import validate_restarts
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import StepDefaults, plan_call
from metaflow_extensions.torchrun.plugins.torchrun.procs import names
from metaflow_extensions.torchrun.plugins.torchrun.procs.failures import clear_round
from metaflow_extensions.torchrun.plugins.torchrun.record import in_step_restarts as records
from metaflow_extensions.torchrun.plugins.torchrun.record.result import TorchrunResult, compact
from metaflow_extensions.torchrun.plugins.torchrun.runtime.restarts import CallRestarts

TB = 'Traceback (most recent call last):\n  File "/home/u/train.py", line 88, in <module>\n    x()\n'
# As node_report.own_cause words a rank the kernel killed (torch's agent saw it die).
KILLED = Cause(CauseKind.RANK_FAILED, "rank 3 (node 1) was killed by SIGKILL", node_index=1, rank=3,
               exit_code=-9, exc_type="killed by signal SIGKILL",
               message="the process ended without a Python exception", call=0)
BUG = Cause(CauseKind.RANK_FAILED, "rank 3 raised ValueError", rank=3, exc_type="ValueError", message="bad",
            traceback=TB, call=0)


_in_call = enter_everywhere


@pytest.mark.parametrize("cause, restarted", [
    (KILLED, True),
    (Cause(CauseKind.RANK_FAILED, "node 1: torchrun ended with exit code 1", exit_code=1), True),
    (Cause(CauseKind.RANK_FAILED, "gloo", exc_type="RuntimeError", message="[gloo] Connection closed by peer",
           traceback=TB, secondary=True), True),
    (Cause(CauseKind.RANK_FAILED, "dist", exc_type="torch.distributed.DistBackendError", traceback=TB), True),
    (Cause(CauseKind.HANG, "no output from any rank for 9 s"), True),
    (BUG, False),
    # A device that failed under the code: its node is the one a spare replaces (@torchrun(spares)).
    (Cause(CauseKind.RANK_FAILED, "rank 1 raised torch.AcceleratorError", exc_type="torch.AcceleratorError",
           message="CUDA error: uncorrectable ECC error encountered", traceback=TB), True),
    (Cause(CauseKind.RANK_FAILED, "rank 1 raised RuntimeError", exc_type="RuntimeError",
           message="CUDA error: CUDA-capable device(s) is/are busy or unavailable", traceback=TB), True),
    (Cause(CauseKind.RANK_FAILED, "rank 1 raised torch.AcceleratorError", exc_type="torch.AcceleratorError",
           message="CUDA error: device-side assert triggered", traceback=TB), False),  # the code's own assert
    (Cause(CauseKind.STEP_FAILED, "the step raised", exc_type="KeyError", traceback=TB), False),
    (Cause(CauseKind.NODE_LOST, "node 1 disconnected"), False),
    (Cause(CauseKind.UNRESPONSIVE, "node 1 silent"), False),
    (Cause(CauseKind.PREEMPTED, "node 1 was told to stop", grace=30.0), False),
    (Cause(CauseKind.INTERRUPTED, "Ctrl-C"), False),
    (Cause(CauseKind.CALL_MISMATCH, "different calls"), False),
])
def test_what_the_gang_restarts_in_the_step(cause, restarted):
    assert restartable_in_step(cause) is restarted


def test_a_killed_rank_restarts_every_node_on_a_fresh_port_until_the_restarts_are_spent(net):
    server = net.server(2, restarts=1)
    c0, c1 = net.join(server, [0, 1])
    first = _in_call(server, [c0, c1])
    c1.report_failure(KILLED, call=0, restart=0)
    decided = [c.news.wait_for_restart_or_verdict(0, 0, GUARD) for c in (c0, c1)]
    assert all(d is not None and d.restart == 1 and d.index == 0 for d in decided), decided
    assert decided[0].rdzv_port == decided[1].rdzv_port != first
    assert decided[0].cause.summary == KILLED.summary and decided[0].cause.node_index == 1
    assert c0.cause is None and c1.cause is None and server.cause is None
    assert server.handlers.training.start == 1  # told before any node: nothing of the replaced ranks is said
    # Node 0's report of the replaced ranks (an echo of the kill) changes nothing.
    c0.report_failure(Cause(CauseKind.RANK_FAILED, "echo", secondary=True, call=0), call=0, restart=0)
    time.sleep(0.3)
    assert server.cause is None and server.handlers.book.calls[0].restart == 1
    # The restarted ranks fail too: no restart is left, the gang ends.
    c1.report_failure(KILLED, call=0, restart=1)
    for cause in wait_cause([c0, c1]):
        assert cause.kind is CauseKind.RANK_FAILED and cause.node_index == 1
    assert c0.news.restart_after(0, 1) is None


def test_a_bug_in_the_users_code_ends_the_gang_even_with_restarts_left(net):
    server = net.server(2, restarts=3)
    c0, c1 = net.join(server, [0, 1])
    _in_call(server, [c0, c1])
    c1.report_failure(BUG, call=0)
    for cause in wait_cause([c0, c1]):
        assert cause.exc_type == "ValueError"
    assert c0.news.restart_after(0, 0) is None and server.handlers.book.calls[0].restart == 0


def test_a_lost_node_ends_the_gang_even_with_restarts_left(net):
    server = net.server(2, restarts=3)
    c0, c1 = net.join(server, [0, 1])
    _in_call(server, [c0, c1])
    c1.close()
    assert wait_cause([c0])[0].kind is CauseKind.NODE_LOST
    assert c0.news.restart_after(0, 0) is None


def test_no_restart_before_every_node_reached_the_call_or_once_one_is_done():
    from metaflow_extensions.torchrun.plugins.torchrun.gang.recovery import CallNow, Failed, GangState, Restart, decide

    def restarted(allowed=2, **call):
        return isinstance(decide(Failed(KILLED), GangState(2, allowed, call=CallNow(0, **call))), Restart)

    assert not restarted(reached=False)  # not every node there: its ranks never ran
    assert restarted() and not restarted(allowed=0) and not restarted(restart=2)
    assert not isinstance(decide(Failed(KILLED), GangState(2, 2)), Restart)  # in no call
    assert not restarted(done=1)


def test_hang_detection_counts_from_the_restart():
    from metaflow_extensions.torchrun.plugins.torchrun.gang.calls import CallBook
    book = CallBook(1)
    state = book.calls.setdefault(0, CallState(0, entries={0: "x"}))
    state.all_entered_at = time.monotonic() - 100
    assert book.hung(time.monotonic(), 10.0, lambda n: None, {}) is not None
    gang_calls.begin_restart(state, 29555)
    assert book.hung(time.monotonic(), 10.0, lambda n: None, {}) is None
    assert (state.restart, state.rdzv_port) == (1, 29555)


def test_a_report_of_the_start_a_restart_replaced_is_not_this_starts():
    """The control waits for every node's report of the start that failed: node 0's of the start it
    failed in, kept for the card, must not stand for its report of the next (its ranks of the next
    start were missing from the card when the control read the view before its own report arrived)."""
    from metaflow_extensions.torchrun.plugins.torchrun.gang.calls import CallBook
    from metaflow_extensions.torchrun.plugins.torchrun.gang.messages import NodeReport
    book = CallBook(2)
    state = book.calls.setdefault(0, CallState(0, entries={0: "x", 1: "x"}))
    state.all_entered_at = time.monotonic()
    book.keep_report(state, 0, NodeReport())  # node 0's ranks failed: a restart in place
    assert book.reports_pending(0, lambda n: True, {}) == [1]
    gang_calls.begin_restart(state, 29555)
    assert book.reports_pending(0, lambda n: True, {}) == [0, 1]  # both owe start 1's
    assert 0 in state.reports  # the replaced start's report stays (a node swapped out sends no newer)
    book.keep_report(state, 1, NodeReport())
    assert book.reports_pending(0, lambda n: True, {}) == [0]


@pytest.mark.parametrize("value", [True, -1, 101, "2", 2.0])
def test_restarts_must_be_a_small_whole_number(value):
    with pytest.raises(TorchrunInvalidArgument, match="restarts"):
        validate_restarts(value, False)


def test_restarts_and_torchs_own_max_restarts_are_not_given_together(tmp_path):
    assert validate_restarts(None, True) == 0 and validate_restarts(0, True) == 0 and validate_restarts(3, False) == 3
    with pytest.raises(TorchrunInvalidArgument, match="give one"):
        validate_restarts(2, True)
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    with pytest.raises(TorchrunInvalidArgument, match=r"restarts=2\) and torchrun_args max_restarts"):
        plan_call(str(script), None, 1, {"max_restarts": 1}, StepDefaults(restarts=2), [str(tmp_path)])
    # Each alone is fine; max_restarts=0 asks no restart of torch.
    plan_call(str(script), None, 1, {"max_restarts": 1}, StepDefaults(), [str(tmp_path)])
    plan_call(str(script), None, 1, {"max_restarts": 0}, StepDefaults(restarts=2), [str(tmp_path)])


@pytest.mark.parametrize("args", [{"max_restarts": 2}, ["--max-restarts", "2"], {"max-restarts": "2"}])
def test_retry_on_infrastructure_refuses_torchs_own_restart_and_points_to_restarts(args):
    """torch's max_restarts restarts a ValueError in the step (a user saw it twice),
    the retry that retry_on="infrastructure" asks never to happen: refused at
    step_init, naming restarts=N, which tells the two apart."""
    from metaflow_extensions.torchrun.plugins.torchrun.errors import Problems
    from metaflow_extensions.torchrun.plugins.torchrun.spec import ATTRIBUTE_DEFAULTS, read_step_spec

    def spec(**attributes):
        problems = Problems()
        read_step_spec(dict(ATTRIBUTE_DEFAULTS, **attributes), [], [2], ["flow.py", "run"], problems)
        return problems.messages

    (said,) = spec(retry_on="infrastructure", torchrun_args=args)
    assert said.startswith("@torchrun(retry_on='infrastructure') with torchrun_args max_restarts=2: ")
    assert "Use @torchrun(restarts=2) instead of max_restarts" in said
    assert spec(retry_on="any", torchrun_args=args) == [] and spec(torchrun_args=args) == []
    assert spec(retry_on="infrastructure", torchrun_args={"max_restarts": 0}) == []
    assert spec(retry_on="infrastructure", restarts=2) == []


@pytest.mark.parametrize("args", [{"max_restarts": 2}, ["--max-restarts", "2"], ["max_restarts", "2"]])
def test_retry_on_infrastructure_refuses_torchs_own_restart_in_a_call_too(tmp_path, args):
    """The same max_restarts given per call, not in @torchrun(torchrun_args):
    refused at the call, pointing to restarts=N; retry_on reaches the planner
    through step_defaults, as read_step_spec read it once."""
    from metaflow_extensions.torchrun.plugins.torchrun.errors import Problems
    from metaflow_extensions.torchrun.plugins.torchrun.spec import ATTRIBUTE_DEFAULTS, read_step_spec, step_defaults

    def defaults(**attributes):
        problems = Problems()
        spec = read_step_spec(dict(ATTRIBUTE_DEFAULTS, **attributes), [], [2], ["flow.py", "run"], problems)
        assert problems.messages == []
        return step_defaults(spec)

    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    with pytest.raises(TorchrunInvalidArgument) as e:
        plan_call(str(script), None, 1, args, defaults(retry_on="infrastructure"), [str(tmp_path)])
    said = str(e.value)
    assert said.startswith("@torchrun(retry_on='infrastructure') with the call's torchrun_args max_restarts=2: ")
    assert "Use @torchrun(restarts=2) instead of max_restarts" in said and said.count("max_restarts=") == 1
    # retry_on='any' (the default) keeps torch's restart; max_restarts=0 asks none.
    plan_call(str(script), None, 1, args, defaults(retry_on="any"), [str(tmp_path)])
    plan_call(str(script), None, 1, args, defaults(), [str(tmp_path)])
    plan_call(str(script), None, 1, {"max_restarts": 0}, defaults(retry_on="infrastructure"), [str(tmp_path)])


def test_a_restart_is_recorded_with_what_it_cost_and_reads_back():
    first = records.InStepRestart(1, KILLED, ran_from=100.0, failed_at=110.0, stopped_at=110.5, restarted_at=111.0)
    assert (first.lost_work_seconds, first.restart_seconds, first.lost_seconds) == (10.0, 1.0, 11.0)
    [done] = records.with_ranks_start([first], [113.0, None, 112.5])
    assert done.ranks_at == 112.5 and done.restart_seconds == 2.5
    wire = done.to_wire()
    assert wire["kind"] == "failed" and wire["stopped"] == KILLED.summary and wire["restart_seconds"] == 2.5
    assert records.InStepRestart.from_wire(wire) == done


def test_the_record_stays_small_with_many_restarts():
    noisy = Cause(CauseKind.RANK_FAILED, "gloo", traceback="x" * 20000, message="m" * 5000, call=0)
    many = [records.InStepRestart(k, noisy, 1.0, 2.0) for k in range(1, 101)]
    result = TorchrunResult(["torchrun"], 0, 2, 2, 0, 1.0, 2.0, in_step_restarts=many)
    data = result.to_dict()
    assert len(data["in_step_restarts"]) == 100 and len(data["in_step_restarts"][0]["cause"]["traceback"]) < 700
    small = compact(data, {}, "report")
    assert [r["restart"] for r in small["in_step_restarts"]] == [1, 94, 95, 96, 97, 98, 99, 100]
    assert small["in_step_restarts_count"] == 100


def test_a_restart_clears_the_replaced_ranks_records_only(tmp_path):
    keep = [names.rank_file(str(tmp_path), 0, names.STATUS_SUFFIX), str(tmp_path / names.ENTRY_FILE)]
    gone = [names.rank_file(str(tmp_path), 3, names.FAILURE_SUFFIX), names.rank_file(str(tmp_path), 1, names.STACKS_SUFFIX),
            names.rank_file(str(tmp_path), 0, names.RETURN_SUFFIX), str(tmp_path / names.AGENT_FAILURES_FILE)]
    for path in keep + gone:
        open(path, "w").close()
    clear_round(str(tmp_path))
    assert all(os.path.exists(p) for p in keep) and not any(os.path.exists(p) for p in gone)


def test_the_card_counts_each_restart_like_an_attempt():
    from metaflow_extensions.torchrun.plugins.torchrun.card import content as card_content
    restarts = [records.InStepRestart(1, KILLED, 100.0, 110.0, restarted_at=111.0, ranks_at=112.5),
                records.InStepRestart(2, KILLED, 112.5, 120.0)]
    result = TorchrunResult(["torchrun"], 0, 2, 2, 0, 100.0, 130.0, in_step_restarts=restarts)
    assert card_content.restart_rows(result) == [
        ["1", "+10.0 s", KILLED.summary, "not from memory (your checkpoint)", "10.0 s", "2.5 s"],
        ["2", "+20.0 s", KILLED.summary, "not from memory (your checkpoint)", "7.5 s", ""],
    ]
    # Resumed from a snapshot saved 0.4 s before the failure: that is the work lost, and the steps say so.
    resumed = records.InStepRestart(1, KILLED, 100.0, 110.0, ranks_at=112.5, resumed_step=41, steps_lost=1,
                                    resumed_from=2, resumed_saved_at=109.6)
    result = TorchrunResult(["torchrun"], 0, 2, 2, 0, 100.0, 130.0, in_step_restarts=[resumed])
    assert card_content.restart_rows(result) == [
        ["1", "+10.0 s", KILLED.summary, "step 41 from memory (node 2's copy), 1 step lost", "0.4 s", "2.5 s"]]


def test_the_card_names_a_swap_in_its_restart_row_and_the_nodes_that_sat_out():
    from metaflow_extensions.torchrun.plugins.torchrun.card import content as card_content
    from metaflow_extensions.torchrun.plugins.torchrun.record.attempts import this_attempt

    swap = records.InStepRestart(1, KILLED, 100.0, 110.0, ranks_at=112.5, work_from=104.0, swapped_out=1, swapped_in=2)
    result = TorchrunResult(["torchrun"], 0, 3, 2, 0, 100.0, 130.0, in_step_restarts=[swap], role="active",
                            out_nodes=[1])
    # A node's own card (no attempts record): the nodes without their hosts.
    assert card_content.restart_rows(result) == [
        ["1", "+10.0 s", "node 1 (?) out, spare node 2 (?) in: " + KILLED.summary, "not from memory (your checkpoint)",
         "6.0 s", "2.5 s"]]
    result.attempts = [this_attempt(0, 90.0, [result], None, None, hosts={1: "host-b", 2: "host-c"})]
    assert card_content.restart_rows(result)[0][2] == "node 1 (host-b) out, spare node 2 (host-c) in: " + KILLED.summary
    assert card_content.topology_rows(result, "gloo")[-3:] == [["this node's role", "active"], ["spares left", "none"],
                                                       ["taken out", "1"]]
    assert card_content.bench_rows(TorchrunResult(["torchrun"], 0, 2, 2, 0, 100.0, 130.0)) == []


def test_a_restarts_lost_work_counts_from_its_ranks_at_the_script_where_known():
    swap = records.InStepRestart(1, KILLED, ran_from=100.0, failed_at=110.0, work_from=104.0)
    assert swap.lost_work_seconds == 6.0
    assert records.InStepRestart.from_wire(swap.to_wire()) == swap
    from metaflow_extensions.torchrun.plugins.torchrun.gang import messages as msg

    started = CallRestarts()
    started.begin(msg.Restart(0, 1, 29500, KILLED, swapped_in=2), ran_from=100.0, stopped_at=111.0,
                  rank_starts=[None, 104.5, 104.0])
    assert started.records[0].work_from == 104.0 and started.records[0].swapped_in == 2


def test_after_a_swap_every_nodes_record_names_whose_copy_the_spare_resumed_from():
    """The spare's store fetched node 0's copy; node 0 (the control, whose record the docs show) read its own:
    both records say node 0. Without a swap a node's own copy is named by none."""
    from metaflow_extensions.torchrun.plugins.torchrun.gang import messages as msg
    from metaflow_extensions.torchrun.plugins.torchrun.runtime.call_snapshots import Resumed

    swap = msg.Restart(0, 1, 29500, KILLED, swapped_in=2, snapshot_source=0)
    assert msg.parse(msg.Restart.to_wire(swap)) == swap  # on the wire to every node
    for own_store in (Resumed(5, None, 5), Resumed(5, 0, 5)):  # the control's, the spare's
        restarts = CallRestarts()
        restarts.begin(swap, ran_from=100.0, stopped_at=111.0, rank_starts=[104.0])
        restarts.resumed(own_store)
        assert (restarts.records[0].resumed_step, restarts.records[0].resumed_from) == (5, 0)
    in_place = CallRestarts()
    in_place.begin(msg.Restart(0, 1, 29500, KILLED), ran_from=100.0, stopped_at=111.0, rank_starts=[104.0])
    in_place.resumed(Resumed(5, None, 5))
    assert in_place.records[0].resumed_from is None


def test_without_a_snapshot_the_ranks_progress_says_how_much_of_the_replaced_work_was_kept(tmp_path):
    """Your checkpoint put the new ranks at step 90 (their first report is 91). The replaced ranks reported steps
    40 at t=100 and 95 at t=155, a step a second: they had done step 90 at t=150, so the work to 150 is kept, not
    lost, and the new ranks trained from their first report."""
    from metaflow_extensions.torchrun.plugins.torchrun.gang import messages as msg
    from metaflow_extensions.torchrun.plugins.torchrun.runtime.restarts import kept_until

    assert kept_until(((40, 100.0), (95, 155.0)), 90) == 150.0
    assert kept_until(((40, 100.0), (95, 155.0)), 95) == 155.0 and kept_until(((40, 100.0), (95, 155.0)), 99) == 155.0
    assert kept_until(((95, 155.0), (95, 155.0)), 90) is None  # one report: no pace to go back by
    assert kept_until(None, 90) is None and kept_until(((40, 100.0), (95, 155.0)), -1) is None
    cause = Cause(CauseKind.RANK_FAILED, "rank 1: killed by signal SIGKILL", node_index=0, time=156.0)
    restarts = CallRestarts()
    restarts.begin(msg.Restart(0, 1, 29500, cause), ran_from=90.0, stopped_at=157.0, rank_starts=[95.0],
                   reported_step=95, replaced_pace=((40, 100.0), (95, 155.0)))
    restarts.reported_from((91, 163.0))
    record = restarts.records[-1]
    assert (record.kept_until, record.trained_at) == (150.0, 163.0)
    assert record.lost_work_seconds == 156.0 - 150.0  # not the 61 s since the ranks started
    # A restart resumed from memory keeps its snapshot's mark.
    restarts.records[-1] = records.InStepRestart(1, cause, ran_from=90.0, failed_at=156.0, resumed_saved_at=154.0)
    restarts.reported_from((91, 163.0))
    assert restarts.records[-1].kept_until is None and restarts.records[-1].lost_work_seconds == 2.0


def test_a_restart_reads_the_pace_and_the_first_report_of_a_starts_slowest_rank_from_its_files(tmp_path):
    import json

    from metaflow_extensions.torchrun.plugins.torchrun.procs.names import PROGRESS_SUFFIX, rank_file
    from metaflow_extensions.torchrun.plugins.torchrun.runtime.restart_loop import reported, slowest

    def report(rank, step, when, start=0, **first):
        with open(rank_file(str(tmp_path), rank, PROGRESS_SUFFIX), "w") as f:
            json.dump(dict({"rank": rank, "step": step, "time": when, "start": start}, **first), f)

    assert reported(str(tmp_path), 0) == (None, None) and slowest(str(tmp_path), 0) is None
    report(0, 20, 110.0, first_step=10, first_time=100.0)
    report(1, 19, 110.5, first_step=9, first_time=100.5)
    assert reported(str(tmp_path), 0) == (20, ((9, 100.5), (19, 110.5)))
    assert reported(str(tmp_path), 1) == (None, None)  # another start's files are not this one's
    # A file that does not say its first report: its latest stands for it.
    report(1, 19, 110.5)
    assert reported(str(tmp_path), 0) == (20, ((19, 110.5), (19, 110.5)))
    # The file says its own first report: the node need not have seen it (it samples every few seconds).
    report(1, 19, 110.5, start=1, first_step=3, first_time=94.0)
    assert slowest(str(tmp_path), 1).first == (3, 94.0)


def test_a_ranks_progress_file_carries_its_first_report():
    from metaflow_extensions.torchrun.plugins.torchrun.procs import rank_progress

    report = rank_progress.ProgressReport.from_file({"rank": 2, "step": 30, "time": 5.0, "first_step": 21,
                                                     "first_time": 1.5})
    assert (report.first_step, report.first_time) == (21, 1.5)
    hostile = rank_progress.ProgressReport.from_file({"rank": 2, "step": 30, "time": 5.0, "first_step": 99,
                                                      "first_time": "x"})
    assert (hostile.first_step, hostile.first_time) == (None, None)  # past the latest, or no time: not believed
    writer = rank_progress._Writer("", "3", "1")
    saved = rank_progress._first
    try:
        rank_progress._first = (7, 2.5)
        made = writer._record((9, None, {}, 3.0))
        assert (made.first_step, made.first_time, made.step) == (7, 2.5, 9)
    finally:
        rank_progress._first = saved
