"""A node keeps its ranks alive after it collected their stacks until the
gang's service says every node's are in (runtime/call_stacks.py): the gang's
other nodes begin their collecting up to a tick later, and would find a
peer's ranks gone. Over a real gang service: the service says so once the
last node's stacks arrive, or once the nodes that still owe them are gone."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from gang_net import GUARD, node_report, wait_cause
from metaflow_extensions.torchrun.plugins.torchrun.base import timeouts
from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.procs.flight import UNSUPPORTED, FlightSummary
from metaflow_extensions.torchrun.plugins.torchrun.runtime.call_stacks import CallStacks
from metaflow_extensions.torchrun.plugins.torchrun.record.result import none_suspected
from proc_helpers import wait_until


def _in_call(net, nodes):
    server = net.server(nodes)
    clients = net.join(server, list(range(nodes)))
    threads = [threading.Thread(target=c.enter_call, args=(0, "train.py"), daemon=True) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(GUARD)
    return server, clients


def _collect_in_background(client, workdir):
    """A node's collect (no live rank: its stacks are empty) on a thread; when it returned."""
    done = {}
    supervisor = SimpleNamespace(live_pids=lambda: set())

    def collect():
        CallStacks().collect(client, 0, supervisor, workdir)
        done["at"] = time.monotonic()

    t = threading.Thread(target=collect, daemon=True)
    t.start()
    return t, done


def test_a_node_stops_its_ranks_only_once_every_nodes_stacks_are_in(net, tmp_path, monkeypatch):
    monkeypatch.setattr(timeouts, "STACKS_WAIT", GUARD)  # the bound out of the way: the event decides
    server, (a, b) = _in_call(net, 2)
    b.report_failure(Cause(CauseKind.RANK_FAILED, "boom"), call=0)
    wait_cause([a, b])
    t, done = _collect_in_background(a, str(tmp_path))
    assert wait_until(lambda: 0 in server.handlers.book.calls[0].stacks, GUARD)  # shared at once, before the wait
    assert "at" not in done and not b.news.wait_stacks_in(0, 0)  # node 1 has not collected: node 0's ranks live
    sent = time.monotonic()
    b.send_stacks(0, {})
    t.join(GUARD)
    assert done["at"] >= sent and a.news.wait_stacks_in(0, 0) and b.news.wait_stacks_in(0, GUARD)  # every node told


def test_a_node_gone_owes_no_stacks_and_a_silent_gang_is_waited_for_at_most_stacks_wait(net, tmp_path):
    server, (a, b, c) = _in_call(net, 3)
    a.send_stacks(0, {})
    assert not a.news.wait_stacks_in(0, 0.3)  # nodes 1 and 2 owe theirs
    b.close()  # lost: owes nothing
    c.call_done(0, None, node_report())  # done with the call: owes nothing
    assert a.news.wait_stacks_in(0, GUARD)
    # Without a service that answers, a node waits STACKS_WAIT from its collect's start, no longer;
    # and not at all where it found the control gone or silent itself (nobody would answer), nor in
    # a stop of its own (no verdict yet: the other nodes stop only once it reports).
    waited: list = []
    news = SimpleNamespace(wait_stacks_in=lambda index, seconds: waited.append(seconds) or False)
    client = SimpleNamespace(cause=Cause(CauseKind.HANG, "no output"), send_stacks=lambda *args: None, news=news)
    began = time.monotonic()
    CallStacks().collect(client, 0, SimpleNamespace(live_pids=lambda: set()), str(tmp_path))
    assert len(waited) == 1 and 0 < waited[0] <= timeouts.STACKS_WAIT
    assert waited[0] >= timeouts.STACKS_WAIT - (time.monotonic() - began)
    for client.cause in (Cause(CauseKind.CONTROL_UNRESPONSIVE, "heard nothing from the control"), None):
        CallStacks().collect(client, 0, SimpleNamespace(live_pids=lambda: set()), str(tmp_path))
    assert len(waited) == 1


def test_why_the_flight_recorder_named_no_one_reaches_the_record_when_nothing_named_a_suspect():
    """Every rank's recorder unsupported and no rank's stack in a collective:
    no culprit, and the reason goes into the call's record (it was said only
    beside suspects the stacks named)."""
    note = "this torch has no _dump_nccl_trace_json"
    where = CallStacks(stacks={r: "Current thread 0x1 (most recent call first):\n  File \"/w/t.py\", line 3 in f\n"
                               for r in range(4)},
                       nodes={r: r // 2 for r in range(4)},
                       flights={r: FlightSummary(UNSUPPORTED, recorder="nccl", note=note) for r in range(4)})
    control = SimpleNamespace(speaks_for_gang=True, hosts=lambda: {0: "a", 1: "b"})
    cause = Cause(CauseKind.HANG, "no rank wrote a line for 20 s")
    assert where.suspects(control, cause) == [] and where.culprits is None
    assert where.flight_unread == "%s on ranks 0-3" % note
    assert none_suspected(None, where.flight_unread, cause) == [
        "No suspect named: torch's Flight Recorder could not say (%s on ranks 0-3)" % note]
    # A failed rank is the cause: no suspect was wanted, so none is explained.
    assert none_suspected(None, where.flight_unread, Cause(CauseKind.RANK_FAILED, "rank 1 raised")) == []
