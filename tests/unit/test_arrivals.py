"""Who the gang waits for (gang/arrivals.py, procs/arrivals.py): a rank's Flight Recorder read into pairs of
its collectives' arrival times (real gloo dumps, and dumps written as torch writes them), a node's ranks
folded into one bounded record, and the control's join naming the rank the others wait for, and nobody in
an even gang, whatever the nodes' clocks and however many collectives a second."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.gang.arrivals import (
    MIN_SEEN, SENT, WARMUP_NS, ArrivalBook, ArrivalTracker, NodeArrivals)
from metaflow_extensions.torchrun.plugins.torchrun.gang import arrivals
from metaflow_extensions.torchrun.plugins.torchrun.gang.gang_progress import NodeProgress, ProgressBook
from metaflow_extensions.torchrun.plugins.torchrun.gang.wire import ProtocolError
from metaflow_extensions.torchrun.plugins.torchrun.procs.arrivals import (
    DEVICE, KEPT, ArrivalWatch, arrival, device_ns, level, level_for, new_entries, read_arrivals)

DUMPS = os.path.join(os.path.dirname(__file__), "flight_dumps")
MS = 1_000_000  # ns
T0 = 10 ** 18  # the ranks' wall clock at the first collective, ns


def test_a_real_gloo_dump_gives_the_default_groups_collectives_in_order():
    with open(os.path.join(DUMPS, "gloo-hang-rank0.json"), "rb") as f:
        text = f.read()
    entries = json.loads(text)["entries"]
    found, newest, count = new_entries(text, -1, lambda seq: True)
    assert found == entries and newest == max(e["record_id"] for e in entries) and count == len(entries)
    read = [a for a in map(arrival, found) if a]
    assert read == [(e["process_group"][0], e["collective_seq_id"], e["time_created_ns"]) for e in entries]
    assert {a[0] for a in read} == {"0", "1"}  # the default group's, and another's
    assert new_entries(text, newest, lambda seq: True) == ([], newest, 0)  # nothing after the last read
    assert new_entries(text, -1, lambda seq: True, most=2) == (entries[-2:], newest, 2)  # a first read: the newest
    later = new_entries(text, newest - 2, lambda seq: seq % 2 == 0)  # the two newest, those wanted only
    assert later[2] == 2 and all(e["collective_seq_id"] % 2 == 0 for e in later[0])
    assert arrival({"process_group": ["0", "default_pg"], "collective_seq_id": True, "time_created_ns": 5}) is None


def test_a_dump_not_written_as_torch_writes_it_is_parsed_whole_and_a_reset_recorder_read_again():
    with open(os.path.join(DUMPS, "gloo-hang-rank0.json"), "rb") as f:
        entries = json.loads(f.read())["entries"]
    spaced = json.dumps({"entries": [dict(reversed(list(e.items()))) for e in entries]})  # keys in another order
    assert new_entries(spaced, -1, lambda seq: True)[0] == json.loads(spaced)["entries"]
    assert new_entries(b"not json", -1, lambda seq: True) == ([], -1, 0) and new_entries(None, 3, bool)[2] == 0
    assert new_entries(json.dumps({"entries": entries}, separators=(",", ":")), 10 ** 6, bool)[2] == len(entries)


def _dump_file(name):
    with open(os.path.join(DUMPS, name), "rb") as f:
        return f.read()


def test_on_nccl_with_timing_an_arrival_is_when_the_collective_began_on_the_device():
    """NCCL's recorder with TORCH_NCCL_ENABLE_TIMING=1: the kernel's own time (CUDA events) back from its end
    as the watchdog found it; else its start as the watchdog found it; gloo's, and NCCL's without timing
    (2.15's nccl2 keeps no duration), know no device time: the host's enqueue time is read."""
    timed = json.loads(_dump_file("nccl-hang-rank0.json"))["entries"]
    done = [e for e in timed if e.get("duration_ms")]
    assert done and all(device_ns(e) == e["time_discovered_completed_ns"] - int(e["duration_ms"] * 1e6) for e in done)
    assert all(arrival(e, DEVICE)[2] == device_ns(e) < e["time_discovered_completed_ns"] for e in done)
    assert all(arrival(e)[2] == e["time_created_ns"] for e in done)  # the host's, on the host's clock
    flying = [e for e in timed if e["state"] == "scheduled"]
    assert flying and all(device_ns(e) is None and arrival(e, DEVICE) is None for e in flying)
    begun = {"time_discovered_started_ns": 7 * MS, "time_discovered_completed_ns": None, "duration_ms": None}
    assert device_ns(begun) == 7 * MS and device_ns(dict(begun, duration_ms=True)) == 7 * MS
    for name in ("gloo-hang-rank0.json", "nccl2-hang-rank0.json"):
        assert all(device_ns(e) is None for e in json.loads(_dump_file(name))["entries"]), name


def test_a_rank_reads_the_devices_clock_where_its_recorder_has_it_and_a_collective_in_flight_again(tmp_path):
    from metaflow_extensions.torchrun.plugins.torchrun.procs.arrivals import HOST

    nccl = ArrivalWatch(str(tmp_path), 0)
    assert nccl.take(_dump_file("nccl-hang-rank0.json"), {"0": 2, "1": 2}, 1.0)
    flying = next(e for e in json.loads(_dump_file("nccl-hang-rank0.json"))["entries"] if e["state"] == "scheduled")
    assert nccl.clock == DEVICE and nccl.record == flying["record_id"] - 1  # read again once it has ended
    read = read_arrivals(str(tmp_path), 0, 0)
    assert read.clock == DEVICE and sorted(read.groups["0"][1]) == [2, 3, 4]
    gloo = ArrivalWatch(str(tmp_path), 1)
    assert gloo.take(_dump_file("gloo-hang-rank1.json"), {"0": 2, "1": 2}, 1.0) and gloo.clock == HOST
    tracker = ArrivalTracker(str(tmp_path))
    assert tracker.sample([0], 0).clock == DEVICE and tracker.sample([0, 1], 0) is None  # one clock a node
    book = ArrivalBook()
    book.update(0, NodeArrivals(1, 2, "host", ("0",), (4,), (2,), (0,), (7,), (1, 2), (0, 1), (1, 1)))
    book.update(1, NodeArrivals(1, 2, "device", ("0",), (4,), (2,), (0,), (7,), (1, 2), (2, 3), (1, 1)))
    assert book.clock == HOST and set(book.pending[("0", 7)]) == {0}  # another clock's record: not compared


def test_one_pair_in_two_to_the_level_is_kept_alike_on_every_rank_whatever_the_period():
    levels = [level(k) for k in range(1, 1 << 16)]
    for n in range(6):
        assert abs(sum(v >= n for v in levels) / len(levels) - 2 ** -n) < 0.01 * 2 ** -n + 0.002
    for period in (8, 9, 64):  # a step's collectives: each position as likely as the others (k's own bits: one)
        kept = [sum(level(k) >= 3 for k in range(p, 1 << 17, period)) for p in range(period)]
        mean = sum(kept) / period
        assert all(abs(n - mean) < 0.3 * mean for n in kept), (period, kept)
    assert level_for(10.0) == 0 and level_for(300.0) == 5 and level_for(1e9) == level_for(1e12)


def dump(times, first=1, group=("0", "default_pg"), record=0):
    """A Flight Recorder dump as torch writes it (keys sorted, no spaces), of ``times`` (ns after T0) as
    collectives ``first``, ``first + 1``, ...; the ring's newest 2,000."""
    entries = [{"collective_seq_id": first + i, "input_sizes": [[4]], "is_p2p": False, "op_id": first + i,
                "process_group": list(group), "profiling_name": "gloo:all_reduce", "record_id": record + i,
                "retired": True, "state": "scheduled", "time_created_ns": T0 + t} for i, t in enumerate(times)]
    return json.dumps({"entries": entries[-2000:], "version": "2.10"}, sort_keys=True, separators=(",", ":"))


def heartbeats(tmp_path, times, every=5.0, send=3.0, tick=0.25):
    """Two nodes of two ranks (0, 1 and 2, 3) training through ``times`` (rank -> ns after T0 of each
    collective): each rank's reader takes the recorder every ``every`` s (or as often as it goes round),
    each node sends every ``send`` s, all at their own phases. The nodes' records, in the order they came:
    (node, record), each sent as the control's clock says T0 (a gap of nothing)."""
    watches = {r: ArrivalWatch(str(tmp_path / ("node%d" % (r // 2))), r, every) for r in range(4)}
    for r in range(4):
        os.makedirs(os.path.dirname(watches[r].path), exist_ok=True)
    clock = [0.0]
    trackers = {n: ArrivalTracker(str(tmp_path / ("node%d" % n)), clock_ns=lambda: T0 + int(clock[0] * 1e9))
                for n in (0, 1)}
    end = max(t[-1] for t in times.values()) / 1e9 + every + send
    out, now, due = [], 0.0, {("r", r): 0.7 + 1.1 * r for r in range(4)}
    due.update({("n", n): 0.4 + 1.5 * n for n in (0, 1)})
    while now <= end:
        for (kind, who), at in sorted(due.items(), key=lambda kv: kv[1]):
            if at > now:
                continue
            if kind == "r":
                seen = [t for t in times[who] if t <= now * 1e9]
                watches[who].take(dump(seen), {"0": 4}, now)
                due[kind, who] = at + watches[who].wait
            else:
                clock[0] = now
                out.append((who, trackers[who].sample([2 * who, 2 * who + 1], 0)))
                due[kind, who] = at + send
        now += tick
    return [(n, dataclasses.replace(r, sent=T0)) for n, r in out if r is not None]


def test_a_node_folds_the_pairs_all_its_ranks_kept(tmp_path):
    times = {r: [k * 100 * MS + (7 * MS if r == 3 else 0) for k in range(1, 101)] for r in range(4)}
    records = heartbeats(tmp_path, times)
    node1 = [r for n, r in records if n == 1]
    got = node1[0]
    assert got.groups == ("0",) and got.sizes == (4,) and got.members == (2,)
    assert set(got.who) == {3} and all(s == v - 7000 for s, v in zip(got.second, got.last))  # rank 2, 7 ms before
    assert all(b - a == 100_000 for a, b in zip(got.last[::2], got.last[1::2]))  # µs: k-1, then k
    seqs = [k for r in node1 for k in r.seq]
    assert seqs == sorted(set(seqs)) and seqs == list(range(seqs[0], seqs[-1] + 1))  # each once, none skipped
    assert all(len(r.seq) <= SENT for _, r in records)
    assert ArrivalTracker(str(tmp_path / "node1"), clock_ns=lambda: 42).sample([2, 3], 0).sent == 42
    assert ArrivalTracker(str(tmp_path / "node1")).sample([2, 3], 1) is None  # another start's files
    assert ArrivalTracker(str(tmp_path / "node1")).sample([2, 3, 4], 0) is None  # a rank not there yet


@pytest.mark.parametrize("content", ['{"rank": 0, "start": 0, "clock": "host", "groups": {"0": {"size": 2, '
                                     '"pairs": [[1, 2]]}}}', "[]", "{",
                                     '{"start": 0, "clock": "host", "groups": {"0": {"size": 0, "pairs": []}}}',
                                     '{"start": 0, "clock": "host", "groups": {"0": {"size": 2, "pairs": [[1, -5, 3]]}}}',
                                     '{"start": 0, "clock": "host", "groups": []}',
                                     '{"start": 0, "clock": "host", "groups": {"0": {"size": 2, "pairs": %s}}}'
                                     % json.dumps([[k, 1, 2] for k in range(KEPT + 1)])])
def test_a_hostile_rank_file_is_not_read(tmp_path, content):
    (tmp_path / "rank-0.arrivals.json").write_text(content)
    assert read_arrivals(str(tmp_path), 0, 0) is None


def test_a_node_record_of_unequal_lengths_or_out_of_bounds_is_refused():
    good = NodeArrivals(1, 2, "host", ("0",), (4,), (2,), (0,), (7,), (1, 2), (0, 1), (1, 1))
    assert NodeArrivals.from_wire(good.to_wire()) == good
    for bad in (dict(good.to_wire(), who=[0]), dict(good.to_wire(), last=[-1, 2]), dict(good.to_wire(), group=[1]),
                dict(good.to_wire(), seq=list(range(1, SENT + 2))), dict(good.to_wire(), second=[2, 1]),
                dict(good.to_wire(), members=[5]), dict(good.to_wire(), sizes=[4, 4]), dict(good.to_wire(), clock="tsc")):
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


def _verdict(tmp_path, times):
    book = ArrivalBook(clock_ns=lambda: T0)
    for node, record in heartbeats(tmp_path, times):
        book.update(node, record)
    return book.verdict()


def test_a_rank_a_quarter_slower_is_named_with_its_node_and_cost(tmp_path):
    verdict = _verdict(tmp_path, _records(late_rank=3, late_ms=25, collectives=160))
    assert verdict is not None and (verdict.ranks, verdict.node, verdict.named) == ((3,), 1, "3"), verdict
    # Held at every collective: the others work 75 ms of each 100 and wait 25 for it (250 ms a second).
    assert verdict.share >= 0.9 and 235 <= verdict.wait_ms <= 265 and 1.29 <= verdict.ratio <= 1.37, verdict


def _simulated(shape, n, slow, slow_ranks=(3,), seconds=None):
    """A simulated job's arrivals (tests/unit/arrival_shapes.py), ns after T0 by rank, and the step-time
    ratio it has; for ``seconds`` (about) or the gang's window of pairs."""
    from arrival_shapes import expected, program, simulate, steps_for

    ops = program(shape, n)
    steps = steps_for(ops) if seconds is None else int(seconds / 0.14)
    run = simulate(ops, slow, slow_ranks=slow_ranks, steps=steps)
    times = {r: [int(a[r] * MS) for a in run.arrivals] for r in range(4)}
    return times, expected(ops, slow, slow_ranks=slow_ranks, steps=steps_for(ops))


@pytest.mark.parametrize("shape, n", [("ddp", 8), ("fsdp", 12)])
def test_a_rank_a_quarter_slower_at_its_work_is_named_with_the_step_time_ratio(tmp_path, monkeypatch, shape, n):
    """Through the nodes' records and the control's join: DDP's 8 overlapped buckets and FSDP's all-gathers."""
    monkeypatch.setattr(arrivals, "WARMUP_NS", 0)  # a few simulated seconds
    times, want = _simulated(shape, n, 1.25)
    verdict = _verdict(tmp_path, times)
    assert verdict is not None and (verdict.named, verdict.node) == ("3", 1), verdict
    assert abs(verdict.ratio - want) <= 0.05 and verdict.share >= 0.9, (verdict, want)


@pytest.mark.parametrize("send, joined", [(3.0, 5), (8.0, 2)])
def test_the_window_keeps_up_with_hundreds_of_collectives_a_second_in_records_of_a_bound_size(tmp_path, send, joined):
    """FSDP of 21 layers, 140 ms steps: 430 collectives a second for 40 s, ranks reading their recorder as
    often as it goes round, nodes sending every 3 s (every 8 s: a gang of 1,024 nodes) at their own phases.
    The nodes send the same pairs: 6 to 12 a second are joined (2 to 5 sent every 8 s), each node's record stays
    within 48 pairs (about 3 KB), and the quarter-slower rank is named at its step-time ratio."""
    times, want = _simulated("fsdp", 63, 1.25, seconds=40)
    records = heartbeats(tmp_path, times, send=send)
    book = ArrivalBook(clock_ns=lambda: T0)
    for node, record in records:
        assert len(record.seq) <= SENT and len(json.dumps(record.to_wire())) < 4000
        book.update(node, record)
    seconds = times[0][-1] / 1e9
    assert len(times[0]) / seconds > 400, len(times[0]) / seconds
    assert book.joined / (seconds - WARMUP_NS / 1e9) > joined and len(book.pending) < 30, (book.joined, book.pending)
    verdict = book.verdict()
    assert verdict is not None and (verdict.named, verdict.node) == ("3", 1), verdict
    assert abs(verdict.ratio - want) <= 0.1, (verdict, want)


GROUPS = r"""
import os, sys, time
import torch, torch.distributed as dist
from metaflow_extensions.torchrun.plugins.torchrun.procs import arrivals

arrivals.TARGET = 1e6  # every pair kept: a few seconds of training
dist.init_process_group("gloo")
rank = dist.get_rank()
pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # tensor parallel: two groups of two
mine = pairs[rank // 2]
work = os.path.join(sys.argv[1], "node%d" % (rank // 2))
os.makedirs(work, exist_ok=True)
watch = arrivals.ArrivalWatch(work, rank)
t = torch.ones(64)
for step in range(60):
    for layer in range(4):
        time.sleep(0.004 * (1.5 if rank == 3 else 1.0))  # rank 3's device: slower at its layers
        dist.all_reduce(t, group=mine)  # the layer's output, all-reduced in its group
    dist.all_reduce(t)  # the data-parallel gradients, once a step: everybody waits for the slow pair
    if step % 20 == 19:
        watch.read_once(dist, sys.modules["torch._C._distributed_c10d"])
dist.barrier()
dist.destroy_process_group()
"""


def test_the_collectives_of_every_group_a_rank_is_in_are_read(tmp_path, monkeypatch):
    """A real gloo job of 4 ranks in two tensor-parallel pairs (0-1 and 2-3), rank 3 slower at its layers:
    in the default group, ranks 2 and 3 arrive late together (their pair's all-reduces held rank 2 for
    rank 3), so that group names their node; in group 2-3, rank 3 is the one its partner waits for."""
    import subprocess
    import sys

    script = tmp_path / "groups.py"
    script.write_text(GROUPS)
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="2000", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
                           str(script), str(tmp_path)], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    files = {r: read_arrivals(str(tmp_path / ("node%d" % (r // 2))), r, 0).groups for r in range(4)}
    assert {r: sorted(f) for r, f in files.items()} == {0: ["0", "1"], 1: ["0", "1"], 2: ["0", "2"], 3: ["0", "2"]}
    assert {f["0"][0] for f in files.values()} == {4} and files[3]["2"][0] == 2
    monkeypatch.setattr(arrivals, "WARMUP_NS", 0)  # a few seconds of training, read at once:
    monkeypatch.setattr(arrivals, "ROOM", 1e6)  # every pair sent, over as many records as it takes
    book = ArrivalBook(clock_ns=lambda: T0)
    for node in (0, 1):
        tracker = ArrivalTracker(str(tmp_path / ("node%d" % node)), clock_ns=lambda: T0)
        while True:
            record = tracker.sample([2 * node, 2 * node + 1], 0)
            if record is None:
                break
            book.update(node, record)
    assert set(book.window) == {"0", "1", "2"}
    verdict = book.verdict()
    assert verdict is not None and (verdict.named, verdict.node) == ("3", 1), verdict


def test_a_slow_machine_of_ddp_buckets_is_named_as_its_node(tmp_path, monkeypatch):
    monkeypatch.setattr(arrivals, "WARMUP_NS", 0)
    times, want = _simulated("ddp", 8, 1.25, slow_ranks=(2, 3))
    verdict = _verdict(tmp_path, times)
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
    monkeypatch.setattr(arrivals, "WARMUP_NS", 0)
    records = heartbeats(tmp_path, _records(late_rank=None, late_ms=0, collectives=160, skew=(0, 40)))
    book, unfixed = ArrivalBook(clock_ns=lambda: T0), ArrivalBook(clock_ns=lambda: T0)
    for node, record in records:
        book.update(node, dataclasses.replace(record, sent=record.sent + (40 * MS if node else 0)))
        unfixed.update(node, record)
    (window,) = book.window.values()
    assert len(window) >= MIN_SEEN and book.verdict() is None
    assert max(j.node.last - j.node.ref for pair in window for j in pair) < 3 * MS  # the ranks' jitter alone
    (window,) = unfixed.window.values()
    assert min(j.node.last - j.node.ref for pair in window for j in pair) > 25 * MS  # node 1 "late" by 40 ms
    assert {j.of_node for pair in window for j in pair} == {1}


def test_the_progress_book_names_the_late_rank_once_it_has_been_late_for_a_while(tmp_path, monkeypatch):
    from metaflow_extensions.torchrun.plugins.torchrun.gang import gang_progress

    real = ArrivalBook.__init__
    monkeypatch.setattr(gang_progress.ArrivalBook, "__init__", lambda self: real(self, clock_ns=lambda: T0))
    monkeypatch.setattr(arrivals, "WARMUP_NS", 0)  # one heartbeat's collectives
    book = ProgressBook(2, 1.5, 300.0)
    for node, record in heartbeats(tmp_path, _records(late_rank=3, late_ms=25, collectives=160)):
        book.update(node, "host-%d" % node, NodeProgress(cpu=0.5, arrivals=record))
    assert book.check(100.0) == [] and book.check(119.0) == []  # late, not yet for long (SUSTAIN)
    (named,) = book.check(121.0)
    assert (named.node_index, named.ranks, named.signal) == (1, "3", "arrival"), named
    assert named.sentence().startswith("rank 3 (node 1, host-1) is the one the others wait for at the collectives: "
                                       "100 % of their waiting, "), named.sentence()
    assert re.search(r"; each step takes 1\.3\dx the time it would without it \(for 21 s\)$", named.sentence()), \
        named.sentence()
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
    for index, record in heartbeats(tmp_path, _records(late_rank=3, late_ms=25, collectives=160)):
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
    assert re.search(r"each step 1\.3\dx the time it would take \(swap_stragglers=1s\)$", cause["summary"]), \
        cause["summary"]


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


THREADS = """
import json, threading
print(json.dumps(sorted(t.name for t in threading.enumerate() if t.name.startswith("torchrun-"))))
"""


@pytest.mark.parametrize("setting, reads", [(None, True), ("1", True), ("0", False), ("off", False)])
def test_the_detector_alone_is_turned_off_in_the_rank(tmp_path, setting, reads):
    """METAFLOW_TORCHRUN_ARRIVALS, as the step's start reads it, reaches a real rank's bootstrap in its entry
    file: off, the rank starts no reader of its arrivals (no recorder dump every few seconds); the Flight
    Recorder stays on, and its reader for a hang's culprit too."""
    import subprocess
    import sys

    from metaflow_extensions.torchrun.plugins.torchrun.base.knobs import ARRIVALS_ENV, read_knobs
    from metaflow_extensions.torchrun.plugins.torchrun.launch.command import BOOTSTRAP_MODULE
    from metaflow_extensions.torchrun.plugins.torchrun.procs import entry, names

    knobs, refused = read_knobs({ARRIVALS_ENV: setting} if setting is not None else {})
    assert not refused and knobs.arrivals is reads
    script = tmp_path / "script.py"
    script.write_text(THREADS)
    work = tmp_path / "work"
    work.mkdir()
    path = entry.write_entry(str(work), [str(script)], knobs.trainer_progress, knobs.arrivals)
    environ = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
    environ.update({names.WORK_DIR_ENV: str(work), "RANK": "0", names.LABELS_ENV: "0", names.ENTRY_ENV: path,
                    names.FR_BUFFER_ENV: "2000", ARRIVALS_ENV: "1"})  # the environment says on: only the file counts
    done = subprocess.run([sys.executable, "-m", BOOTSTRAP_MODULE, path], env=environ, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    threads = json.loads(done.stdout.strip().splitlines()[-1])
    assert ("torchrun-arrivals" in threads) is reads and "torchrun-flight" in threads, threads
