"""The goodput ledger (runtime/goodput.py): parts that never overlap and add
up to the wall time, failures' costs, the wire shape and the card's bars."""

import json

from metaflow_extensions.torchrun.plugins.torchrun.runtime import goodput
from metaflow_extensions.torchrun.plugins.torchrun.runtime.attempts import Attempt, CallStart, Checkpoint
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
