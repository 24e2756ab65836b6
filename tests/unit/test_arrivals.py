"""Who the gang waits for (gang/arrivals.py, procs/arrivals.py): a rank's Flight Recorder read into its
collectives' arrival times (real gloo dumps), a node's ranks folded into one bounded record, and the
control's join naming the rank the others wait for, and nobody in an even gang, whatever the nodes'
clocks."""

from __future__ import annotations

import json
import os
import random

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.gang.arrivals import (
    MIN_SEEN, SENT, WARMUP_NS, ArrivalBook, ArrivalTracker, NodeArrivals)
from metaflow_extensions.torchrun.plugins.torchrun.gang import arrivals
from metaflow_extensions.torchrun.plugins.torchrun.gang.gang_progress import NodeProgress, ProgressBook
from metaflow_extensions.torchrun.plugins.torchrun.gang.wire import ProtocolError
from metaflow_extensions.torchrun.plugins.torchrun.procs.arrivals import newest, read_arrivals, tail_entries

DUMPS = os.path.join(os.path.dirname(__file__), "flight_dumps")
MS = 1_000_000  # ns


def test_a_real_gloo_dump_gives_the_default_groups_collectives_in_order():
    with open(os.path.join(DUMPS, "gloo-hang-rank0.json")) as f:
        entries = json.load(f)["entries"]
    found = newest(entries, 0)
    assert [s for s, _ in found] == sorted({e["collective_seq_id"] for e in entries
                                            if e["process_group"][1] == "default_pg"})
    assert all(t == next(e["time_created_ns"] for e in entries if e["collective_seq_id"] == s
                         and e["process_group"][1] == "default_pg") for s, t in found)
    assert newest(entries, found[-1][0]) == [] and newest("not a list", 0) == []
    assert newest([{"process_group": ["0", "default_pg"], "collective_seq_id": True, "time_created_ns": 5}], 0) == []


def test_only_the_newest_entries_are_parsed_and_another_layout_is_parsed_whole():
    with open(os.path.join(DUMPS, "gloo-hang-rank0.json"), "rb") as f:
        text = f.read()
    entries = json.loads(text)["entries"]
    assert tail_entries(text, 3) == entries[-3:] and tail_entries(text.decode(), 100) == entries
    shuffled = json.dumps({"entries": [dict(reversed(list(e.items()))) for e in entries]})  # keys in another order
    assert tail_entries(shuffled, 3) == json.loads(shuffled)["entries"]
    assert tail_entries(b"not json", 3) == [] and tail_entries(None, 3) == []
    cut = text[:text.rfind(b'{"collective_seq_id"') + 30]  # a dump cut short: parsed whole, which fails
    assert tail_entries(cut, 3) == []


def _write(directory, rank, seqs, times, start=0):
    with open(os.path.join(directory, "rank-%d.arrivals.json" % rank), "w") as f:
        json.dump({"rank": rank, "start": start, "seq": seqs, "ns": times}, f)


def test_a_node_folds_its_ranks_over_the_collectives_all_reached(tmp_path):
    base = 10 ** 18
    _write(tmp_path, 2, list(range(1, 101)), [base + s * 100 * MS for s in range(1, 101)])
    _write(tmp_path, 3, list(range(5, 103)), [base + s * 100 * MS + 7 * MS for s in range(5, 103)])
    got = ArrivalTracker(str(tmp_path), clock_ns=lambda: 42).sample([2, 3], 0)
    assert got.seq == 100 - SENT + 1 and len(got.last) == SENT and got.ranks == 2 and got.sent == 42
    assert set(got.who) == {3} and got.last[1] - got.last[0] == 100_000  # µs
    assert got.second[0] == got.last[0] - 7000  # rank 2's, 7 ms before rank 3's
    assert ArrivalTracker(str(tmp_path)).sample([2, 3], 1) is None  # another start's files
    assert ArrivalTracker(str(tmp_path)).sample([2, 3, 4], 0) is None  # a rank not there yet


@pytest.mark.parametrize("content", ['{"rank": 0, "start": 0, "seq": [1, 2], "ns": [5]}', "[]", "{",
                                     '{"start": 0, "seq": [1], "ns": [-5]}', '{"start": 0, "seq": ["1"], "ns": [5]}'])
def test_a_hostile_rank_file_is_not_read(tmp_path, content):
    (tmp_path / "rank-0.arrivals.json").write_text(content)
    assert read_arrivals(str(tmp_path), 0, 0) is None


def test_a_node_record_of_unequal_lengths_or_out_of_bounds_is_refused():
    good = NodeArrivals(1, 2, 3, 2, (1, 2), (0, 1), (1, 1))
    assert NodeArrivals.from_wire(good.to_wire()) == good
    for bad in (dict(good.to_wire(), who=[0]), dict(good.to_wire(), last=[-1, 2]),
                dict(good.to_wire(), last=list(range(SENT + 1))), dict(good.to_wire(), second=[2, 1])):
        with pytest.raises(ProtocolError):
            NodeArrivals.from_wire(bad)


def _records(late_rank, late_ms, collectives=100, skew=(0, 0), step_ms=100, seed=1, late_node=None, late_until=None):
    """Two nodes of two ranks (0, 1 and 2, 3): each collective's arrivals, ``late_rank`` late by
    ``late_ms`` (None: the ranks take turns, jittered), before collective ``late_until`` if given;
    node n's clock ``skew[n]`` ms off."""
    rng = random.Random(seed)
    times = {r: [] for r in range(4)}
    for k in range(collectives):
        for r in range(4):
            jitter = rng.uniform(0, 2) * MS
            late = late_ms * MS if (r == late_rank or r // 2 == late_node) and k < (late_until or k + 1) else 0
            times[r].append(k * step_ms * MS + int(jitter) + late + skew[r // 2] * MS)
    return times


def _fold(tmp_path, times, start=0, first=1):
    out = {}
    for node, ranks in ((0, (0, 1)), (1, (2, 3))):
        d = tmp_path / ("node%d" % node)
        d.mkdir(exist_ok=True)
        for r in ranks:
            n = len(times[r])
            _write(d, r, list(range(first, first + n))[-128:], [10 ** 18 + t for t in times[r]][-128:], start)
        out[node] = ArrivalTracker(str(d), clock_ns=lambda: 10 ** 18).sample(list(ranks), start)
    return out


def _verdict(tmp_path, times, batches=4):
    book = ArrivalBook(clock_ns=lambda: 10 ** 18)
    n = len(times[0])
    step = n // batches
    for b in range(1, batches + 1):  # the nodes' heartbeats come in as the collectives go on
        part = {r: t[:b * step] for r, t in times.items()}
        for node, record in _fold(tmp_path, part).items():
            book.update(node, record)
        book.tally([0, 1])
    return book.verdict()


def test_a_rank_a_quarter_slower_is_named_with_its_node_and_cost(tmp_path):
    verdict = _verdict(tmp_path, _records(late_rank=3, late_ms=25, collectives=160))
    assert verdict is not None and (verdict.ranks, verdict.node, verdict.named) == ((3,), 1, "3"), verdict
    # Held at every collective: the others work 75 ms of each 100 and wait 25 for it (250 ms a second).
    assert verdict.share >= 0.9 and 235 <= verdict.wait_ms <= 265 and 1.29 <= verdict.ratio <= 1.37, verdict


def _simulated(shape, n, slow, slow_ranks=(3,)):
    """A simulated job's arrivals (tests/unit/arrival_shapes.py) as the ranks' files would hold them, and the
    step-time ratio it has."""
    from arrival_shapes import expected, program, simulate, steps_for

    ops = program(shape, n)
    run = simulate(ops, slow, slow_ranks=slow_ranks, steps=steps_for(ops))
    times = {r: [int(a[r] * MS) for a in run.arrivals] for r in range(4)}
    return times, expected(ops, slow, slow_ranks=slow_ranks, steps=steps_for(ops))


@pytest.mark.parametrize("shape, n", [("ddp", 8), ("fsdp", 12)])
def test_a_rank_a_quarter_slower_at_its_work_is_named_with_the_step_time_ratio(tmp_path, monkeypatch, shape, n):
    """Through the nodes' records and the control's join: DDP's 8 overlapped buckets and FSDP's all-gathers."""
    monkeypatch.setattr(arrivals, "WARMUP_NS", 0)  # a few simulated seconds
    times, want = _simulated(shape, n, 1.25)
    verdict = _verdict(tmp_path, times, batches=len(times[0]) // 40)
    assert verdict is not None and (verdict.named, verdict.node) == ("3", 1), verdict
    assert abs(verdict.ratio - want) <= 0.05 and verdict.share >= 0.9, (verdict, want)


def test_a_slow_machine_of_ddp_buckets_is_named_as_its_node(tmp_path, monkeypatch):
    monkeypatch.setattr(arrivals, "WARMUP_NS", 0)
    times, want = _simulated("ddp", 8, 1.25, slow_ranks=(2, 3))
    verdict = _verdict(tmp_path, times, batches=len(times[0]) // 40)
    assert verdict is not None and (verdict.named, verdict.node) == ("2-3", 1), verdict
    assert abs(verdict.ratio - want) <= 0.1, (verdict, want)


def test_a_slow_machine_whose_ranks_take_turns_at_being_last_is_named_as_a_node(tmp_path):
    verdict = _verdict(tmp_path, _records(late_rank=None, late_ms=25, collectives=160, late_node=1))
    assert verdict is not None and (verdict.ranks, verdict.node, verdict.named) == ((2, 3), 1, "2-3"), verdict
    assert verdict.share >= 0.9, verdict


@pytest.mark.parametrize("seed", range(5))
def test_an_even_gang_names_nobody(tmp_path, seed):
    assert _verdict(tmp_path, _records(late_rank=None, late_ms=0, collectives=160, seed=seed)) is None


def test_a_rank_late_only_while_the_start_warms_up_is_not_named(tmp_path, monkeypatch):
    """Late at the first 10 s of collectives (77 % of them), then even: uncounted, nobody is named."""
    times = _records(late_rank=3, late_ms=25, collectives=130, late_until=WARMUP_NS // (100 * MS))
    assert _verdict(tmp_path, times) is None
    monkeypatch.setattr(arrivals, "WARMUP_NS", 0)
    assert _verdict(tmp_path, times).named == "3"  # counted, they would name it


def test_a_node_whose_clock_is_off_is_put_on_the_controls_clock(tmp_path, monkeypatch):
    """Node 1's clock 40 ms ahead: its arrivals look 40 ms late; its heartbeats' send times, 40 ms ahead as
    well, put them back. Without that, the others would seem to wait 40 ms for node 1 at every collective."""
    monkeypatch.setattr(arrivals, "WARMUP_NS", 0)  # one heartbeat's SENT collectives: all in a warm-up of their own
    times = _records(late_rank=None, late_ms=0, collectives=160, skew=(0, 40))
    book = ArrivalBook(clock_ns=lambda: 10 ** 18)
    for node, record in _fold(tmp_path, times).items():
        book.update(node, NodeArrivals(record.base, record.sent + (40 * MS if node else 0), record.seq, record.ranks,
                                       record.last, record.who, record.second))
    book.tally([0, 1])
    assert len(book.window) >= MIN_SEEN and book.verdict() is None
    assert max(j.node.last - j.node.ref for j in book.window) < 3 * MS  # the ranks' jitter alone
    unfixed = ArrivalBook(clock_ns=lambda: 10 ** 18)
    for node, record in _fold(tmp_path, times).items():
        unfixed.update(node, record)
    unfixed.tally([0, 1])
    assert min(j.node.last - j.node.ref for j in unfixed.window) > 25 * MS  # node 1 "late" by 40 ms
    assert {j.of_node for j in unfixed.window} == {1}


def test_the_progress_book_names_the_late_rank_once_it_has_been_late_for_a_while(tmp_path, monkeypatch):
    from metaflow_extensions.torchrun.plugins.torchrun.gang import gang_progress

    real = ArrivalBook.__init__
    monkeypatch.setattr(gang_progress.ArrivalBook, "__init__", lambda self: real(self, clock_ns=lambda: 10 ** 18))
    monkeypatch.setattr(arrivals, "WARMUP_NS", 0)  # one heartbeat's collectives
    book = ProgressBook(2, 1.5, 300.0)
    records = _fold(tmp_path, _records(late_rank=3, late_ms=25, collectives=160))
    for node, record in records.items():
        book.update(node, "host-%d" % node, NodeProgress(cpu=0.5, arrivals=record))
    assert book.check(100.0) == [] and book.check(119.0) == []  # late, not yet for long (SUSTAIN)
    (named,) = book.check(121.0)
    assert (named.node_index, named.ranks, named.signal) == (1, "3", "arrival"), named
    assert named.sentence().startswith("rank 3 (node 1, host-1) is the one the others wait for at the collectives: "
                                       "100 % of their waiting, "), named.sentence()
    assert "; each step takes 1.33x the time it would without it (for 21 s)" in named.sentence(), named.sentence()
    assert book.check(130.0) == [] and book.current().stragglers[0].seconds == 30.0  # named once, kept up to date


def _swap_gang(net, tmp_path, monkeypatch, restarts):
    """Three nodes (node 2 a spare) whose service hears node 1's rank 3 arrive late at every collective."""
    from gang_net import new_config
    from test_node_loss import Node

    from metaflow_extensions.torchrun.plugins.torchrun.gang import gang_progress

    monkeypatch.setattr(gang_progress, "SUSTAIN", 0.0)
    monkeypatch.setattr(arrivals, "WARMUP_NS", 0)  # one heartbeat's collectives
    server = net.server(config=new_config(3, restarts=restarts, spares=1, swap_stragglers=1.0))
    nodes = [Node(net, server, n) for n in range(3)]
    for node in nodes:
        node.enter()
    for index, record in _fold(tmp_path, _records(late_rank=3, late_ms=25, collectives=160)).items():
        nodes[index].send(type="hb", progress=NodeProgress(cpu=0.5, arrivals=record).to_wire())
    return nodes


def test_the_service_swaps_the_late_ranks_node_for_a_spare(net, tmp_path, monkeypatch):
    n0, _, _ = _swap_gang(net, tmp_path, monkeypatch, restarts=1)
    restart = n0.next("restart", timeout=8.0)
    assert restart is not None and restart["swapped_in"] == 2, restart
    cause = restart["cause"]
    assert cause["kind"] == "straggler" and cause["node_index"] == 1 and cause["call"] == 0, cause
    assert cause["summary"].startswith("node 1 (host-1, ranks 3) has been the one the others wait for at the "
                                       "collectives for "), cause["summary"]
    assert "each step 1.33x the time it would take (swap_stragglers=1s)" in cause["summary"], cause["summary"]


def test_with_no_restart_left_a_late_rank_trains_on(net, tmp_path, monkeypatch):
    n0, _, _ = _swap_gang(net, tmp_path, monkeypatch, restarts=0)
    assert n0.next("restart", timeout=4.0) is None
    assert n0.next("abort", timeout=0.1) is None


@pytest.mark.parametrize("value", [True, 5, 0, -1, float("nan"), 10 ** 9, "30"])
def test_swap_stragglers_is_a_number_of_seconds_in_range(value):
    from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunInvalidArgument
    from metaflow_extensions.torchrun.plugins.torchrun.launch.inputs import validate_swap_stragglers

    with pytest.raises(TorchrunInvalidArgument, match=r"swap_stragglers=.*from 10 to"):
        validate_swap_stragglers(value, 1, 1)


@pytest.mark.parametrize("spares,restarts", [(0, 1), (None, 1), (1, 0)])
def test_swap_stragglers_needs_a_spare_and_a_restart(spares, restarts):
    from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunInvalidArgument
    from metaflow_extensions.torchrun.plugins.torchrun.launch.inputs import validate_swap_stragglers

    with pytest.raises(TorchrunInvalidArgument, match=r"needs a spare to swap in and a restart to do it"):
        validate_swap_stragglers(60, spares, restarts)


def test_swap_stragglers_reaches_the_step_defaults():
    from test_node_loss import _read

    from metaflow_extensions.torchrun.plugins.torchrun.spec import step_defaults

    spec, said = _read(swap_stragglers=60, spares=1, restarts=1)
    assert said == [] and step_defaults(spec).swap_stragglers == 60.0
    assert step_defaults(_read()[0]).swap_stragglers is None
