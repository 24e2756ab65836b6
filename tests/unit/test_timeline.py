"""timeline.py: the card's chart as a Vega-Lite spec, built from a result.

The spec is checked against the structure Metaflow's VegaChart and Vega-Lite
read (a schema written here: no schema is fetched), for what it draws (nodes,
ranks, calls, the failure) and for its size at 1,024 nodes x 8 ranks.
"""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest

import records
from metaflow_extensions.torchrun.plugins.torchrun.gang.messages import RankStatus
from metaflow_extensions.torchrun.plugins.torchrun.card import timeline
from metaflow_extensions.torchrun.plugins.torchrun.record.result import TorchrunResult

T0 = 1_800_000_000.0

_FIELD = {"type": "object", "required": ["field"], "properties": {
    "field": {"type": "string"}, "type": {"enum": ["quantitative", "nominal", "temporal", "ordinal"]}}}
_LAYER = {
    "type": "object",
    "required": ["data", "mark", "encoding"],
    "additionalProperties": False,
    "properties": {
        "data": {"type": "object", "required": ["values"], "additionalProperties": False,
                 "properties": {"values": {"type": "array", "items": {
                     "type": "object", "additionalProperties": {"type": ["string", "number"]}}}}},
        "mark": {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["bar", "rule", "text"]}}},
        "encoding": {"type": "object", "required": ["x"], "additionalProperties": False, "properties": {
            "x": _FIELD, "x2": _FIELD, "y": _FIELD, "text": _FIELD,
            "color": {"type": "object", "required": ["field", "scale"], "properties": {
                "scale": {"type": "object", "required": ["domain", "range"]}}},
            "tooltip": {"type": "array", "items": _FIELD}}},
    },
}
SPEC_SCHEMA = {
    "type": "object",
    "required": ["$schema", "layer", "width", "height"],
    "additionalProperties": False,
    "properties": {
        "$schema": {"type": "string", "pattern": "^https://vega.github.io/schema/vega-lite/v\\d+\\.json$"},
        "title": {"type": "object", "required": ["text"]},
        "width": {"type": "integer", "minimum": 1},  # never "container": see timeline.WIDTH_PX
        "height": {"type": "integer", "minimum": 1},
        "layer": {"type": "array", "minItems": 1, "items": _LAYER},
        "config": {"type": "object"},
    },
}


def _ranks(node, per_node, start=5.0, end=9.0, code=0):
    return [{"rank": node * per_node + i, "local_rank": i, "start": T0 + start, "end": T0 + end, "exit_code": code}
            for i in range(per_node)]


def _result(nodes=2, per_node=2, cause=None, calls=1, reports=None):
    reports = reports if reports is not None else {
        str(n): {"ranks": _ranks(n, per_node)} for n in range(nodes)}
    attempts = [{"attempt": 0, "calls": [{"call": k, "started_at": T0 + 1 + 3 * k} for k in range(calls)]}]
    return TorchrunResult(
        command=[], node_index=0, num_nodes=nodes, nproc_per_node=per_node, exit_code=0 if cause is None else 1,
        started_at=T0 + 1, ended_at=T0 + 10, cause=records.cause(cause) if cause else None,
        attempts=records.attempts(attempts),
        gang=records.gang({"joined_at": {str(n): T0 + n * 0.01 for n in range(nodes)},
                           "finished_at": {str(n): T0 + 10 for n in range(nodes)}, "reports": reports}),
    )


def _spec(result):
    from metaflow_extensions.torchrun.plugins.torchrun.card.content import gang_ranks

    return timeline.spec(timeline.from_result(result, gang_ranks(result)))


def _layer(spec, mark):
    return [layer for layer in spec["layer"] if layer["mark"]["type"] == mark]


def test_the_spec_has_the_structure_vega_lite_reads():
    failed = _result(cause={"summary": "x", "node_index": 1, "rank": 2, "time": T0 + 8})
    for result in (_result(), failed, _result(nodes=1024, per_node=8)):
        spec = _spec(result)
        jsonschema.validate(spec, SPEC_SCHEMA)
        json.dumps(spec, allow_nan=False)  # plain JSON: no NaN, no infinity, no objects


def test_nodes_then_ranks_on_one_axis_from_the_first_join():
    spec = _spec(_result())
    bars = _layer(spec, "bar")[0]
    assert bars["encoding"]["y"]["sort"] == [
        "node 0", "node 1", "rank 0 (node 0)", "rank 1 (node 0)", "rank 2 (node 1)", "rank 3 (node 1)"]
    rows = {row["lane"]: row for row in bars["data"]["values"]}
    assert rows["node 1"]["start"] == pytest.approx(0.01) and rows["node 1"]["end"] == pytest.approx(10)
    assert rows["rank 3 (node 1)"]["start"] == pytest.approx(5) and rows["rank 3 (node 1)"]["end"] == pytest.approx(9)
    assert rows["rank 3 (node 1)"]["state"] == "rank: exit 0"
    assert spec["height"] == timeline.LANE_PX * 6


def test_every_call_is_marked_and_the_failure_named():
    cause = {"summary": "node 1, rank 2: ValueError", "node_index": 1, "rank": 2, "time": T0 + 8.5}
    spec = _spec(_result(cause=cause, calls=3))
    calls = _layer(spec, "rule")[0]["data"]["values"]
    assert [(c["label"], c["at"]) for c in calls] == [("call 1", 1.0), ("call 2", 4.0), ("call 3", 7.0)]
    failure = _layer(spec, "rule")[1]
    assert failure["mark"]["color"] == "#d62728"
    # At the failing rank's end (its record: T0 + 9), not when its node reported it.
    assert failure["data"]["values"] == [{"at": pytest.approx(9.0), "label": "failed: rank 2 (node 1)"}]
    assert [layer["data"]["values"][0]["label"] for layer in _layer(spec, "text")] == ["call 1",
                                                                                        "failed: rank 2 (node 1)"]


@pytest.mark.parametrize("record, state", [
    ({"rank": 0, "exit_code": 0}, "rank: exit 0"),
    ({"rank": 0, "exit_code": 1}, "rank: failed"),
    ({"rank": 0, "exit_code": -11}, "rank: failed"),
    ({"rank": 0, "exit_code": -15}, "rank: stopped"),
    ({"rank": 2, "exit_code": -9}, "rank: failed"),  # the root cause itself was killed
    ({"rank": 0, "exit_code": None}, "rank: no exit"),
    ({"rank": 0, "exit_code": True}, "rank: no exit"),
])
def test_how_a_rank_ended(record, state):
    assert timeline.rank_state(RankStatus(local_rank=0, **record), failed_rank=2) == state


def test_the_legend_lists_the_states_drawn():
    reports = {"0": {"ranks": _ranks(0, 2, code=-15)}, "1": {"ranks": _ranks(1, 2, code=1)}}
    spec = _spec(_result(reports=reports, cause={"summary": "x", "node_index": 1, "rank": 2, "time": T0 + 8}))
    scale = _layer(spec, "bar")[0]["encoding"]["color"]["scale"]
    assert scale["domain"] == ["node", "rank: failed", "rank: stopped"]
    assert len(scale["range"]) == 3


def test_no_text_from_a_rank_reaches_the_spec():
    hostile = "<img src=x onerror=alert(1)> </script>"
    cause = {"summary": hostile, "message": hostile, "node_index": 1, "rank": 2, "time": T0 + 8}
    reports = {"0": {"ranks": _ranks(0, 2), "tails": {"0": {"stdout": [hostile]}}},
               "1": {"ranks": [dict(r, host=hostile) for r in _ranks(1, 2)]}}
    text = json.dumps(_spec(_result(cause=cause, reports=reports)))
    assert "<" not in text and "onerror" not in text


@pytest.mark.parametrize("cause, label", [
    ({"node_index": 1, "rank": 2}, "failed: rank 2 (node 1)"),
    ({"node_index": 1, "kind": "node_lost"}, "node 1: node lost"),
    ({"kind": "hang"}, "gang stopped: hang"),
])
def test_the_failure_is_named_by_numbers_and_its_kind(cause, label):
    spec = _spec(_result(cause=dict(cause, summary="x", time=T0 + 8)))
    assert _layer(spec, "rule")[-1]["data"]["values"][0]["label"] == label


def test_a_cause_of_no_known_kind_never_reaches_the_chart():
    # A stored record read back: its cause is checked field by field, so a kind
    # that is not one of ours (hostile text) is no cause at all.
    assert records.cause({"kind": "<b>not a kind</b>", "summary": "x"}) is None


def test_a_node_that_never_joined_has_a_lane_saying_so():
    result = _result(nodes=3)
    del result.gang.joined_at[2], result.gang.finished_at[2], result.gang.reports[2]
    spec = _spec(result)
    assert "node 2 (never joined)" in _layer(spec, "bar")[0]["encoding"]["y"]["sort"]


def _size(nodes, per_node, calls=1):
    cause = {"summary": "x", "node_index": nodes - 3, "rank": (nodes - 3) * per_node + 5, "time": T0 + 8}
    spec = _spec(_result(nodes=nodes, per_node=per_node, cause=cause, calls=calls))
    return spec, len(json.dumps(spec))


def test_at_1024_nodes_x_8_ranks_the_spec_is_small_and_shows_the_failing_node():
    spec, size = _size(1024, 8)
    assert size < 24_000, size
    lanes = _layer(spec, "bar")[0]["encoding"]["y"]["sort"]
    assert len(lanes) <= timeline.NODE_LANES + timeline.RANK_LANES
    assert lanes[0] == "nodes 0-31" and lanes[timeline.NODE_LANES - 1] == "nodes 992-1023"
    # The failing node's ranks are drawn, whichever node it is, then node 0's on.
    assert "rank 8173 (node 1021)" in lanes and "rank 0 (node 0)" in lanes
    notes = timeline.captions(timeline.from_result(_result(nodes=1024, per_node=8), {}))
    assert notes == ["nodes are drawn in 32 groups of 32"]


def test_the_size_does_not_grow_with_the_gang_or_the_calls():
    sizes = [_size(n, 8, calls=c)[1] for n, c in ((1024, 1), (4096, 1), (16384, 1), (1024, 5000))]
    assert max(sizes) - min(sizes) < 2_000, sizes


def _swapped(hosts=("h-b", "h-c")):
    from metaflow_extensions.torchrun.plugins.torchrun.record.attempts import RestartMark
    from metaflow_extensions.torchrun.plugins.torchrun.record.in_step_restarts import InStepRestart

    result = _result(nodes=3)
    cause = records.cause({"summary": "node 1 (h-b), rank 2: <b>killed</b>", "node_index": 1, "rank": 2,
                           "time": T0 + 6})
    result.in_step_restarts = [InStepRestart(1, cause, T0 + 2, T0 + 6, swapped_out=1, swapped_in=2)]
    mark = RestartMark(call=0, restart=1, failed_at=T0 + 6, stopped="x", swapped_out=1, swapped_in=2,
                       out_host=hosts[0], in_host=hosts[1])
    result.attempts = [dataclasses.replace(result.attempts[0], restarts=(mark,))]
    return result


def test_a_swap_is_marked_at_its_time_naming_both_nodes_and_hosts():
    spec = _spec(_swapped())
    jsonschema.validate(spec, SPEC_SCHEMA)
    (swap,) = [layer for layer in _layer(spec, "rule") if layer["encoding"]["tooltip"][0]["title"] == "swap"]
    assert swap["data"]["values"] == [{"at": pytest.approx(6.0),
                                       "label": "node 1 (h-b) out, spare node 2 (h-c) in: rank 2 failed"}]
    # A host's name is shown as a host name has it; the cause by numbers only.
    text = json.dumps(_spec(_swapped(hosts=("<img src=x onerror=alert(1)>", ""))))
    assert "<" not in text and "onerror=" not in text and "spare node 2 (?) in" in text
    # Without a swap: no such mark.
    assert not [layer for layer in _layer(_spec(_result()), "rule") if layer["encoding"]["tooltip"][0]["title"] == "swap"]


def test_a_spare_waits_and_a_node_taken_out_stops_on_their_own_lanes():
    result = _swapped()
    result.out_nodes = [1]
    result.gang.finished_at[1] = T0 + 6.1  # the gang counts a node taken out done at once
    bars = _layer(_spec(result), "bar")[0]
    lanes = [(r["lane"], r["state"], round(r["start"], 2), round(r["end"], 2)) for r in bars["data"]["values"]
             if r["lane"].startswith("node ")]
    # Node 1 trained until its swap at +6 s, then sat out; node 2 waited, then trained in its place.
    assert lanes == [("node 0", "node", 0.0, 10.0), ("node 1", "node", 0.01, 6.0),
                     ("node 1", "node: taken out", 6.0, 10.0), ("node 2", "node: spare", 0.02, 6.0),
                     ("node 2", "node", 6.0, 10.0)]
    assert bars["encoding"]["color"]["scale"]["domain"][:3] == ["node", "node: spare", "node: taken out"]
    # A spare never used waits the whole call; a node the preflight took out sits it all out.
    unused = _result(nodes=3)
    unused.spare_nodes, unused.out_nodes = [2], [1]
    states = {r["lane"]: r["state"] for r in _layer(_spec(unused), "bar")[0]["data"]["values"]}
    assert (states["node 1"], states["node 2"]) == ("node: taken out", "node: spare")
