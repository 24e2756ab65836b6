"""A node keeps its ranks alive for STACKS_HOLD after it began collecting
their stacks (runtime/call_stacks.py): the gang's other nodes begin their
collecting up to a tick later, and would find a peer's ranks gone."""

from __future__ import annotations

import time
from types import SimpleNamespace

from metaflow_extensions.torchrun.plugins.torchrun import timeouts
from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.procs.flight import UNSUPPORTED, FlightSummary
from metaflow_extensions.torchrun.plugins.torchrun.runtime.call_stacks import CallStacks, none_suspected


class _Client:
    def __init__(self):
        self.sent = []

    def send_stacks(self, index, stacks, flights):
        self.sent.append((index, time.monotonic()))


def test_the_ranks_stop_only_after_the_hold_and_the_stacks_go_out_at_once(tmp_path):
    client = _Client()
    session = SimpleNamespace(client=client)
    supervisor = SimpleNamespace(live_pids=lambda: set())
    began = time.monotonic()
    CallStacks().collect(session, 0, supervisor, str(tmp_path))
    returned = time.monotonic()
    assert returned - began >= timeouts.STACKS_HOLD  # the supervisor's SIGTERM comes after this
    assert len(client.sent) == 1 and client.sent[0][1] - began < timeouts.STACKS_HOLD  # shared first


def test_why_the_flight_recorder_named_no_one_reaches_the_record_when_nothing_named_a_suspect():
    """Every rank's recorder unsupported and no rank's stack in a collective:
    no culprit, and the reason goes into the call's record (it was said only
    beside suspects the stacks named)."""
    note = "this torch has no _dump_nccl_trace_json"
    where = CallStacks(stacks={r: "Current thread 0x1 (most recent call first):\n  File \"/w/t.py\", line 3 in f\n"
                               for r in range(4)},
                       nodes={r: r // 2 for r in range(4)},
                       flights={r: FlightSummary(UNSUPPORTED, recorder="nccl", note=note) for r in range(4)})
    session = SimpleNamespace(server=SimpleNamespace(hosts=lambda: {0: "a", 1: "b"}))
    cause = Cause(CauseKind.HANG, "no rank wrote a line for 20 s")
    assert where.suspects(session, cause) == [] and where.culprits is None
    assert where.record()["flight_unread"] == "%s on ranks 0-3" % note
    assert none_suspected(None, where.flight_unread, cause) == [
        "No suspect named: torch's Flight Recorder could not say (%s on ranks 0-3)" % note]
    # A failed rank is the cause: no suspect was wanted, so none is explained.
    assert none_suspected(None, where.flight_unread, Cause(CauseKind.RANK_FAILED, "rank 1 raised")) == []
