"""flight.py and flight_ask.py: torch's Flight Recorder, read in a live rank and
boiled down to a few lines per process group. The gloo dumps are real JSON of
torch 2.13's gloo backend (flight_dumps/capture.py made them); the NCCL ones are
built as torch's writer lays them out (flight_dumps/nccl_writer.py: no GPU here;
make gpu-check reads real ones). The rank side runs a real two-process gloo
group, one rank blocked in a collective the other skips; which recorder a rank
reads is shown with a stand-in c10d module that has both dumps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from proc_helpers import wait_until

from metaflow_extensions.torchrun.plugins.torchrun.base.knobs import FLIGHT_RECORDER_ENV, read_knobs
from metaflow_extensions.torchrun.plugins.torchrun.procs import flight, flight_ask
from metaflow_extensions.torchrun.plugins.torchrun.procs.flight import (EMPTY, FAILED, NO_GROUP, OK, FlightError,
                                                                        FlightGroup, FlightSummary, summarize)

DUMPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flight_dumps")
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def dump(name: str) -> bytes:
    with open(os.path.join(DUMPS, name), "rb") as f:
        return f.read()


# -- the summary of a dump ------------------------------------------------------------


def test_a_rank_waiting_in_an_async_all_reduce_shows_it_open():
    summary = summarize(dump("gloo-hang-rank0.json"))
    assert summary.state == OK and summary.entries == 6
    assert summary.groups == (
        FlightGroup("0", 5, "all_reduce", False, "default_pg"),  # entered, not completed: open first
        FlightGroup("1", 1, "all_reduce", True, "undefined"),
    )


def test_the_rank_that_skipped_it_shows_its_last_collective_completed():
    summary = summarize(dump("gloo-hang-rank1.json"))
    assert summary.group("0") == FlightGroup("0", 4, "barrier", True, "default_pg")
    assert summary.group("9") is None


def test_a_gloo_entry_retired_is_done_though_pg_status_reads_one_behind():
    """gloo's two workers: the one done with barrier #4 can write pg_status after the
    other wrote all_reduce #5's, so it says 4 for good; #5's entry is retired all the same."""
    data = json.loads(dump("gloo-hang-rank0.json"))
    data["entries"][-1]["retired"] = True  # #5 came back; pg_status still says 4
    assert summarize(json.dumps(data)).group("0") == FlightGroup("0", 5, "all_reduce", True, "default_pg")
    data["entries"][-1]["retired"] = False
    data["pg_status"]["0"]["last_completed_collective"] = "5"  # the other way round, done too
    assert summarize(json.dumps(data)).group("0").done
    del data["pg_status"]["0"]
    assert not summarize(json.dumps(data)).group("0").done  # neither says it: open


def test_a_recorder_turned_off_or_a_dump_that_is_not_torchs_reads_as_such():
    assert summarize(dump("gloo-off-rank0.json")) == FlightSummary(EMPTY, recorder="gloo")
    for text in (b"", b"not json", b"[]", b'{"entries": {}}', b'{"entries": [{"op_id": 1}]}',
                 b'{"entries": [{"process_group": 5, "collective_seq_id": 1, "op_id": 1}]}'):
        assert summarize(text).state == FAILED, text


def test_at_most_a_few_groups_open_ones_first():
    data = json.loads(dump("gloo-hang-rank1.json"))
    template = data["entries"][-1]
    data["entries"] = [dict(template, process_group=[str(g), "g"], pg_id=g, collective_seq_id=g, op_id=g,
                            retired=g != 3) for g in range(1, 10)]
    data["pg_status"] = {str(g): {"last_completed_collective": str(g if g != 3 else 2)} for g in range(1, 10)}
    groups = summarize(json.dumps(data)).groups
    assert len(groups) == flight.MAX_GROUPS
    assert [g.name for g in groups] == ["3", "9", "8", "7"] and not groups[0].done


def test_an_nccl_dump_reads_by_the_entries_state_its_watchdog_keeps():
    """Stock ProcessGroupNCCL: "completed" is the watchdog's word; an entry
    retired but not completed has timed out, and is still open."""
    summary = summarize(dump("nccl-hang-rank0.json"), flight.NCCL)
    assert (summary.state, summary.recorder, summary.entries) == (OK, "nccl", 6)
    assert summary.groups == (FlightGroup("0", 5, "all_reduce", False, "default_pg"),
                              FlightGroup("1", 1, "all_reduce", True, "undefined"))
    assert summarize(dump("nccl-hang-rank1.json"), flight.NCCL).group("0") == FlightGroup(
        "0", 4, "barrier", True, "default_pg")
    timed_out = json.loads(dump("nccl-hang-rank0.json"))
    timed_out["entries"][-1]["retired"] = True  # the watchdog gave up on it
    timed_out["pg_status"]["0"]["last_completed_collective"] = "5"
    assert summarize(json.dumps(timed_out), flight.NCCL).group("0").waiting


def test_nccl2_through_torch_2_15s_hook_reads_a_retired_entry_as_done():
    """The hook retires at completion, or at issue where the backend cannot
    tell (then "scheduled" without a duration): never every op open."""
    summary = summarize(dump("nccl2-hang-rank0.json"), "nccl2")
    assert summary.recorder == "nccl2" and summary.groups[0] == FlightGroup("0", 5, "all_reduce", False, "default_pg")
    at_issue = json.loads(dump("nccl2-hang-rank0.json"))
    for e in at_issue["entries"][:-1]:
        e["state"] = "scheduled"
    assert [g.done for g in summarize(json.dumps(at_issue), "nccl2").groups] == [False, True]


@pytest.mark.parametrize("version", ["3.0", "1.5", None, 2.1, ""])
def test_a_dump_format_not_read_here_is_said_unsupported_never_guessed(version):
    data = json.loads(dump("gloo-hang-rank0.json"))
    data["version"] = version
    summary = summarize(json.dumps(data))
    assert summary.state == flight.UNSUPPORTED and summary.groups == ()
    assert "format %s" % version in summary.note and "reads 2.x" in summary.note


def test_an_entry_in_a_state_torch_does_not_write_or_no_version_fails_the_dump():
    data = json.loads(dump("nccl-hang-rank0.json"))
    data["entries"][-1]["state"] = "hung"
    assert summarize(json.dumps(data), flight.NCCL).state == FAILED
    del data["version"]
    assert summarize(json.dumps(data), flight.NCCL) == FlightSummary(FAILED, recorder="nccl")


# -- which recorder a rank reads ----------------------------------------------------------


class _Backend:
    def __init__(self, name):
        self._name = name

    def name(self):
        return self._name


class _Group:
    def __init__(self, names):
        self._device_types = list(names)
        self._names = names

    def _get_backend(self, device):
        return _Backend(self._names[device])


class _Dist:
    """torch.distributed as far as flight_ask reads it: a default group served
    by one backend per device, and the backend string torch gives for it."""

    def __init__(self, names, text=None, initialized=True):
        self._group, self._text, self._initialized = _Group(names), text, initialized
        self.distributed_c10d = self

    def is_available(self):
        return True

    def is_initialized(self):
        return self._initialized

    def _get_default_group(self):
        if self._text is not None:
            raise RuntimeError("no backend objects in this stand-in")
        return self._group

    def get_backend(self):
        return self._text


class _C10d:
    """torch._C._distributed_c10d with both dumps (a CUDA build): each says
    which recorder it read; ``per_backend`` as torch 2.15's takes ``backend``."""

    def __init__(self, per_backend=False):
        self.calls = []
        self.per_backend = per_backend

    def _dump_fr_trace_json(self, collectives, only_active, **kw):
        if kw and not self.per_backend:
            raise TypeError("_dump_fr_trace_json(): incompatible function arguments")
        self.calls.append(("fr", kw.get("backend", "gloo")))
        return dump("nccl2-hang-rank0.json" if kw else "gloo-hang-rank1.json")

    def _dump_nccl_trace_json(self, collectives, only_active):
        self.calls.append(("nccl", collectives, only_active))
        return dump("nccl-hang-rank0.json")


def _no_nccl():
    """A CPU build: no NCCL dump at all."""
    c10d = _C10d()
    c10d._dump_nccl_trace_json = None  # type: ignore[method-assign]
    return c10d


def test_an_nccl_group_reads_the_nccl_recorder_not_gloos():
    c10d = _C10d()
    summary = flight_ask.summary_of(_Dist({"cpu": "gloo", "cuda": "nccl"}), c10d)
    assert c10d.calls == [("nccl", True, False)]
    assert summary.recorder == "nccl" and summary.group("0") == FlightGroup("0", 5, "all_reduce", False, "default_pg")
    c10d = _C10d()
    assert flight_ask.summary_of(_Dist({"cpu": "gloo", "cuda": "gloo"}), c10d).group("0").op == "barrier"
    assert c10d.calls == [("fr", "gloo")]  # gloo: today's call


def test_nccl2_reads_its_own_recorder_by_name_where_torch_keeps_one():
    c10d = _C10d(per_backend=True)
    summary = flight_ask.summary_of(_Dist({"cuda": "nccl2"}), c10d)
    assert c10d.calls == [("fr", "nccl2")] and summary.recorder == "nccl2" and summary.groups[0].waiting


@pytest.mark.parametrize("dist, c10d, note", [
    (_Dist({"cuda": "nccl"}), _no_nccl(), "the nccl Flight Recorder: this torch has no _dump_nccl_trace_json"),
    (_Dist({"cuda": "nccl2"}), _C10d(), "the nccl2 Flight Recorder: this torch keeps no Flight Recorder per backend"),
])
def test_a_recorder_this_torch_cannot_read_is_unsupported_and_says_why(dist, c10d, note):
    summary = flight_ask.summary_of(dist, c10d)
    assert summary.state == flight.UNSUPPORTED and summary.groups == () and summary.note.startswith(note)
    assert ("fr", "gloo") not in c10d.calls  # never gloo's recorder in its place
    assert FlightSummary.from_wire(json.loads(json.dumps(summary.to_wire()))) == summary


def test_the_backend_string_is_read_where_the_groups_backends_are_not():
    assert flight_ask.default_backends(_Dist({}, text="cpu:gloo,cuda:nccl")) == ("gloo", "nccl")
    assert flight_ask.default_backends(_Dist({}, text="nccl")) == ("nccl",)
    assert [flight_ask.recorder_for(b) for b in (("gloo", "gloo"), ("gloo", "nccl"), ("nccl-legacy",), ("mpi",), ())] \
        == ["gloo", "nccl", "nccl", "mpi", "gloo"]
    assert flight_ask.summary_of(_Dist({}, initialized=False), _C10d()) == FlightSummary(NO_GROUP)


# -- on the wire ------------------------------------------------------------------------


def test_a_summary_crosses_the_wire_unchanged():
    summary = summarize(dump("gloo-hang-rank0.json"))
    assert FlightSummary.from_wire(json.loads(json.dumps(summary.to_wire()))) == summary


@pytest.mark.parametrize("bad", [
    None, [], {"state": "nope"}, {"state": OK, "groups": {}}, {"state": OK, "entries": -1},
    {"state": OK, "entries": True}, {"state": OK, "groups": [{}] * (flight.MAX_GROUPS + 1)},
    {"state": OK, "groups": [{"name": "0", "entered": "5", "op": "x", "done": False}]},
    {"state": OK, "groups": [{"name": "0", "entered": True, "op": "x", "done": False}]},
    {"state": OK, "groups": [{"name": "0", "entered": -1, "op": "x", "done": False}]},
    {"state": OK, "groups": [{"name": "0", "entered": 1, "op": "x", "done": 0}]},
    {"state": OK, "groups": [{"name": "0" * 65, "entered": 1, "op": "x", "done": False}]},
    {"state": OK, "groups": [{"name": "0", "entered": 1, "op": ["x"], "done": False}]},
    {"state": OK, "groups": [7]},
])
def test_hostile_summaries_are_refused_field_by_field(bad):
    with pytest.raises(FlightError):
        FlightSummary.from_wire(bad)


def test_a_nodes_summaries_are_bounded():
    one = summarize(dump("gloo-hang-rank0.json"))
    many = {r: one for r in range(4096)}
    cut = flight.bound(many, 64 * 1024)
    assert 0 < len(cut) < 4096 and all(len(s.groups) == 1 and s.groups[0].waiting for s in cut.values())
    assert len(json.dumps({str(r): s.to_wire() for r, s in cut.items()})) <= 64 * 1024
    assert flight.bound({0: one}, 64 * 1024) == {0: one}


# -- in a live rank ---------------------------------------------------------------------

RANK = textwrap.dedent(
    """
    import datetime, os, sys, time
    sys.path.insert(0, sys.argv[3])
    from metaflow_extensions.torchrun.plugins.torchrun.procs import flight_ask
    rank, work = int(sys.argv[1]), sys.argv[2]
    flight_ask.listen(work, rank)
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + os.path.join(work, "store"), rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=300))  # outlives the test's settle window
    for _ in range(5):
        dist.all_reduce(torch.ones(1))
    if os.fork() == 0:  # a data loader's worker: no thread of ours in it
        time.sleep(300)
        os._exit(0)
    print("ready", flush=True)
    if rank == 0:
        dist.all_reduce(torch.ones(1))  # blocked: rank 1 skips it
    time.sleep(300)
    """
)


def test_a_rank_blocked_in_a_collective_answers_with_what_its_recorder_holds(tmp_path, procs):
    """The knob's value (3 entries, not the default) is what torch keeps."""
    work = str(tmp_path)
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE=str(read_knobs({FLIGHT_RECORDER_ENV: "3"})[0].flight_recorder))
    ranks = [procs.popen([sys.executable, str(script), str(r), work, PKG_ROOT], env=env, stdout=subprocess.PIPE,
                         start_new_session=True) for r in (0, 1)]
    try:
        _blocked_rank_answers(work, ranks)
    finally:
        for p in ranks:  # each rank with its forked child
            os.killpg(p.pid, signal.SIGKILL)


# Rank 0 blocked in all_reduce #6, rank 1 back from #5: what each recorder must say, whole. The
# hang-suspect logic (procs/culprit.py) names rank 1 by its group being done while rank 0's is open.
BLOCKED = FlightSummary(OK, (FlightGroup("0", 6, "all_reduce", False, "default_pg"),), 3, "gloo")
RETURNED = FlightSummary(OK, (FlightGroup("0", 5, "all_reduce", True, "default_pg"),), 3, "gloo")
# Until then: rank 0 may not have entered #6 yet, and gloo marks #5 completed (pg_status) on its
# worker thread once the work is done, which the caller may already be past: on a loaded 2-core CI
# machine that has taken over 60 s (the ranks' gloo timeout then was 60 s, so rank 0 died first and the
# failure named neither rank). The ranks now live past the window, and a failure says what each held.
SETTLE_S = 150


def _blocked_rank_answers(work, ranks):
    for p in ranks:
        assert p.stdout.readline().strip() == b"ready"
    began = time.monotonic()
    latest = {}  # each rank's latest answer: a loaded machine may leave one out of a round
    while latest != {0: BLOCKED, 1: RETURNED} and time.monotonic() - began < SETTLE_S:
        asking = time.monotonic()
        asked = flight_ask.ask(work, [0, 1, 2])  # asked again until both say it, or the deadline: no fixed sleep
        latest.update(asked.answers(time.monotonic() + 10))
        assert asked.asked == (0, 1), asked.asked  # rank 2 has no FIFO: not waited for
        assert time.monotonic() - asking < 5, "a round took %.1f s; answers so far: %s" % (
            time.monotonic() - asking, latest)
        time.sleep(0.1)
    print("both recorders settled in %.2f s" % (time.monotonic() - began))
    assert latest.get(0) == BLOCKED, "rank 0, in all_reduce #6, after %d s: %s" % (SETTLE_S, latest.get(0))
    assert latest.get(1) == RETURNED, "rank 1, back from all_reduce #5, after %d s: %s" % (SETTLE_S, latest.get(1))
    again = flight_ask.ask(work, [0]).answers(time.monotonic() + 10)  # asked twice: answered twice
    assert again == {0: BLOCKED}


def test_a_rank_without_torch_distributed_answers_at_once_and_nothing_listens_when_off(tmp_path, procs):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        sys.path.insert(0, sys.argv[2])
        from metaflow_extensions.torchrun.plugins.torchrun.procs import flight_ask
        flight_ask.listen(sys.argv[1], 4)
        print("ready", flush=True)
        time.sleep(60)
    """))
    p = procs.popen([sys.executable, str(script), str(tmp_path), PKG_ROOT], stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"ready"
    assert wait_until(lambda: os.path.exists(flight_ask.ask_path(str(tmp_path), 4)))
    for _ in range(20):  # asked again at once: the thread, back before the node closed its end, answers no echo
        assert flight_ask.ask(str(tmp_path), [4]).answers(time.monotonic() + 5) == {4: FlightSummary(NO_GROUP)}
    assert flight_ask.ask(str(tmp_path), [5]).asked == ()  # no FIFO: not waited for


@pytest.mark.parametrize("env, on", [
    ({}, False), ({"TORCH_FR_BUFFER_SIZE": "0"}, False), ({"TORCH_FR_BUFFER_SIZE": "5"}, True),
    ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "5"}, True), ({"TORCH_FR_BUFFER_SIZE": "0", "TORCH_NCCL_TRACE_BUFFER_SIZE": "5"},
                                                   False),
    ({"TORCH_FR_BUFFER_SIZE": "x"}, False),
])
def test_a_rank_listens_only_where_torch_records(env, on):
    assert flight_ask.recording(env) is on


def test_the_knob_reads_as_entries():
    def entries(text):
        read, refused = read_knobs({FLIGHT_RECORDER_ENV: text} if text is not None else {})
        return refused[0].split(": ")[1] if refused else read.flight_recorder

    assert [entries(v) for v in (None, "", "500", " 7 ", "0", "off", "OFF", "no", "-3", "x", "1.5")] == [
        2000, 2000, 500, 7, 0, 0, 0, 0] + ["give a whole number of at least 0, or off"] * 3
