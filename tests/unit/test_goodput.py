"""The goodput ledger (record/goodput.py): parts that never overlap and add
up to the wall time, failures' costs, the wire shape and the card's bars."""

import json

from metaflow_extensions.torchrun.plugins.torchrun.record import goodput
from metaflow_extensions.torchrun.plugins.torchrun.record.attempts import Attempt, CallStart, Checkpoint
from metaflow_extensions.torchrun.plugins.torchrun.cause import CauseKind


def _attempt(k, start, formed, call, first, end, recorded, stopped="succeeded", resumed=None):
    return Attempt(attempt=k, started_at=start, gang_formed_at=formed, calls=(CallStart(0, call),),
                   first_output_at=first, ended_at=end, recorded_at=recorded, stopped=stopped,
                   kind=None if stopped == "succeeded" else CauseKind.NODE_LOST, resumed_from=resumed)


def _two_attempts():
    failed = _attempt(0, 100.0, 105.0, 104.0, 110.0, 160.0, 165.0, stopped="node 1 disconnected")
    ok = _attempt(1, 175.0, 180.0, 179.0, 186.0, 226.0, 228.0, resumed=Checkpoint(key="k", created_at=150.0))
    return [failed, ok]


def test_parts_add_up_to_the_wall_time_and_split_the_failure():
    led = goodput.ledger(_two_attempts(), now=228.0)
    assert led is not None
    assert abs(sum(led.parts.values()) - led.wall_seconds) < 1e-9
    assert led.wall_seconds == 128.0
    p = led.parts
    # attempt 0: gang 5, start-up 5, trained 40 up to the checkpoint at 150, then 10 lost; 5 to stop.
    assert (p["gang"], p["startup"], p["lost_work"], p["stop"]) == (5.0, 5.0, 10.0, 5.0)
    # restart: 165 -> 175 between the attempts, then attempt 1's 11 s to its first line.
    assert p["restart"] == 10.0 + 11.0
    assert p["productive"] == 40.0 + 40.0 and p["other"] == 2.0
    assert round(led.effective_percent, 2) == round(100 * 80 / 128, 2)
    first, second = led.segments
    assert first.cause == "node 1 disconnected" and first.lost_seconds == 25.0
    assert first.time_to_restart == 186.0 - 160.0
    assert second.cause is None and second.lost_seconds == 0.0


def test_without_a_checkpoint_the_whole_attempt_is_lost():
    failed, ok = _two_attempts()
    ok = Attempt(**dict(ok.__dict__, resumed_from=None))
    led = goodput.ledger([failed, ok], now=228.0)
    assert led.segments[0].parts["productive"] == 0.0 and led.segments[0].parts["lost_work"] == 50.0


def test_marks_out_of_order_or_missing_never_make_a_negative_part():
    odd = Attempt(attempt=0, started_at=100.0, gang_formed_at=90.0, calls=(CallStart(0, 300.0),),
                  first_output_at=None, ended_at=50.0, recorded_at=None, stopped="x")
    unknown = Attempt(attempt=1, stopped="unknown: its control task left no record")
    last = _attempt(2, 200.0, None, 201.0, None, 210.0, 211.0)
    led = goodput.ledger([odd, unknown, last], now=211.0)
    assert all(v >= 0 for s in led.segments for v in s.parts.values())
    assert abs(sum(led.parts.values()) - led.wall_seconds) < 1e-9


def test_the_wire_shape_round_trips_and_hostile_input_is_dropped():
    led = goodput.ledger(_two_attempts(), now=228.0)
    wire = json.loads(json.dumps(led.to_wire()))
    assert set(wire["parts"]) == set(goodput.PARTS) and wire["effective_percent"] == round(led.effective_percent, 2)
    back = goodput.Ledger.from_wire(wire)
    assert back.parts == led.parts and len(back.segments) == 2 and back.segments[0].restart is None
    assert goodput.Ledger.from_wire({"started_at": "x"}) is None
    assert goodput.Ledger.from_wire({"started_at": 1, "ended_at": 2, "segments": [1, {"attempt": True}]}).segments == ()


def test_no_attempt_with_a_start_gives_no_ledger():
    assert goodput.ledger([Attempt(attempt=0)], now=1.0) is None


def test_the_card_draws_one_bar_per_attempt():
    led = goodput.ledger(_two_attempts(), now=228.0)
    spec = goodput.bar_spec(led)
    assert {v["attempt"] for v in spec["data"]["values"]} == {"attempt 0", "attempt 1"}
    rows = goodput.rows(led)
    assert len(rows) == 2 and len(rows[0]) == len(goodput.HEADERS)
    assert "effective training 62.5% of 2m 08s over 2 attempts" in led.summary()


# -- a swap (@torchrun(spares)) and an in-step restart: segments of their own ----------------------

def _swap(failed_at=120.0, stopped_at=121.0, back_at=123.0, work_from=110.0, out=1, came_in=2):
    from metaflow_extensions.torchrun.plugins.torchrun.record.attempts import RestartMark

    return RestartMark(call=0, restart=1, failed_at=failed_at, stopped="node 1 (h1), rank 2: killed by signal SIGKILL",
                       kind=CauseKind.RANK_FAILED, stopped_at=stopped_at, back_at=back_at, work_from=work_from,
                       swapped_out=out, swapped_in=came_in, out_host="h1", in_host="h2")


def test_a_swap_is_a_segment_named_by_its_nodes_with_what_it_cost():
    # The call's first line is its last start's (130, after the swap): start-up ends at the first ranks' start.
    a = Attempt(attempt=0, started_at=100.0, gang_formed_at=105.0, calls=(CallStart(0, 104.0),),
                first_output_at=130.0, ended_at=160.0, recorded_at=162.0, stopped="succeeded",
                restarts=(_swap(),))
    led = goodput.ledger([a], now=162.0)
    assert abs(sum(led.parts.values()) - led.wall_seconds) < 1e-9 and led.wall_seconds == 62.0
    before, after = led.segments
    assert (before.started_at, before.ended_at, before.restart) == (100.0, 121.0, None)
    assert {k: v for k, v in before.parts.items() if v} == {"gang": 5.0, "startup": 5.0, "lost_work": 10.0, "stop": 1.0}
    assert before.cause == "node 1 (h1) out, spare node 2 (h2) in: node 1 (h1), rank 2: killed by signal SIGKILL"
    assert (before.swapped_out, before.swapped_in) == (1, 2)
    # Time lost: the work since the ranks started, the stop, the new ranks' start; time to train again: 3 s.
    assert before.lost_seconds == 10.0 + 1.0 + 2.0 and before.time_to_restart == 3.0
    assert (after.started_at, after.ended_at, after.restart, after.cause) == (121.0, 162.0, 1, None)
    assert {k: v for k, v in after.parts.items() if v} == {"restart": 2.0, "productive": 37.0, "other": 2.0}
    assert "over 1 attempt and 1 in-step restart (1 swap)" in led.summary()
    back = goodput.Ledger.from_wire(json.loads(json.dumps(led.to_wire())))
    assert (back.segments[0].swapped_out, back.segments[0].swapped_in, back.segments[1].swapped_in) == (1, 2, None)
    assert goodput.rows(led)[0][0] == "attempt 0" and goodput.rows(led)[1][0] == "attempt 0, after restart 1"
    assert goodput.rows(led)[0][-1].startswith("node 1 (h1) out, spare node 2 (h2) in: ")


def test_a_restart_in_place_is_a_segment_too_and_an_attempt_failing_after_it_loses_only_what_followed():
    from metaflow_extensions.torchrun.plugins.torchrun.record.attempts import with_costs

    in_place = _swap(out=None, came_in=None)
    failed = Attempt(attempt=0, started_at=100.0, gang_formed_at=105.0, calls=(CallStart(0, 104.0),),
                     first_output_at=124.0, ended_at=160.0, recorded_at=165.0, stopped="node 1 disconnected",
                     kind=CauseKind.NODE_LOST, restarts=(in_place,))
    ok = _attempt(1, 175.0, 180.0, 179.0, 186.0, 226.0, 228.0)
    led = goodput.ledger([failed, ok], now=228.0)
    first, second, third = led.segments
    assert first.cause == "restart 1: node 1 (h1), rank 2: killed by signal SIGKILL" and first.swapped_in is None
    # Without a checkpoint the attempt's failure loses the work since the restart's ranks started (123), not since 110.
    assert second.restart == 1 and second.parts["lost_work"] == 160.0 - 123.0 and second.cause == "node 1 disconnected"
    assert third.attempt == 1 and abs(sum(led.parts.values()) - led.wall_seconds) < 1e-9
    costed = with_costs([failed, ok])[0]
    assert costed.lost_work_seconds == 160.0 - 123.0


def test_a_restart_resumed_from_a_snapshot_in_memory_loses_only_the_work_after_that_snapshot():
    """Saved at 119.5, failed at 120: half a second of work lost, not the ten since the ranks started."""
    import dataclasses

    resumed = dataclasses.replace(_swap(), resumed_step=42, steps_lost=1, kept_until=119.5)
    a = Attempt(attempt=0, started_at=100.0, gang_formed_at=105.0, calls=(CallStart(0, 104.0),),
                first_output_at=130.0, ended_at=160.0, recorded_at=162.0, stopped="succeeded", restarts=(resumed,))
    led = goodput.ledger([a], now=162.0)
    assert abs(sum(led.parts.values()) - led.wall_seconds) < 1e-9
    before = led.segments[0]
    assert before.parts["productive"] == 9.5 and before.parts["lost_work"] == 0.5
    assert before.lost_seconds == 0.5 + 1.0 + 2.0 and before.steps_lost == 1
    back = goodput.Ledger.from_wire(json.loads(json.dumps(led.to_wire())))
    assert back.segments[0].steps_lost == 1 and back.segments[1].steps_lost is None
    # A snapshot saved before the ranks reached the script (a clock apart) keeps nothing: never negative.
    early = dataclasses.replace(resumed, kept_until=50.0)
    a2 = dataclasses.replace(a, restarts=(early,))
    assert goodput.ledger([a2], now=162.0).segments[0].parts["lost_work"] == 10.0


def test_the_cards_rows_say_the_steps_a_restart_from_memory_lost():
    import dataclasses

    resumed = dataclasses.replace(_swap(), resumed_step=42, steps_lost=3, kept_until=119.5)
    a = Attempt(attempt=0, started_at=100.0, gang_formed_at=105.0, calls=(CallStart(0, 104.0),),
                first_output_at=130.0, ended_at=160.0, recorded_at=162.0, stopped="succeeded", restarts=(resumed,))
    rows = goodput.rows(goodput.ledger([a], now=162.0))
    column = goodput.HEADERS.index("steps lost (from memory)")
    assert [r[column] for r in rows] == ["3", ""] and all(len(r) == len(goodput.HEADERS) for r in rows)


def test_a_restarts_start_up_counts_as_restart_until_its_ranks_first_snapshot_not_as_training():
    """The new ranks reach the script at 123 and commit their first snapshot at 127.5: the 4.5 s between (imports,
    process group, model, load) are the restart's, where they used to count as productive."""
    import dataclasses

    resumed = dataclasses.replace(_swap(), resumed_step=42, steps_lost=0, kept_until=120.0, trained_at=127.5)
    a = Attempt(attempt=0, started_at=100.0, gang_formed_at=105.0, calls=(CallStart(0, 104.0),),
                first_output_at=130.0, ended_at=160.0, recorded_at=162.0, stopped="succeeded", restarts=(resumed,))
    led = goodput.ledger([a], now=162.0)
    assert abs(sum(led.parts.values()) - led.wall_seconds) < 1e-9
    after = led.segments[1]
    assert after.parts["restart"] == 127.5 - 121.0 and after.parts["productive"] == 160.0 - 127.5
    untimed = dataclasses.replace(resumed, trained_at=None)  # snapshots off, or none saved: the script's first line
    assert goodput.ledger([dataclasses.replace(a, restarts=(untimed,))], now=162.0).segments[1].parts["restart"] == 2.0
    # A mark past the attempt's end (clocks apart) is clamped: parts never negative.
    late = dataclasses.replace(resumed, trained_at=500.0)
    parts = goodput.ledger([dataclasses.replace(a, restarts=(late,))], now=162.0).segments[1].parts
    assert min(parts.values()) >= 0.0 and parts["productive"] == 0.0
