"""What the network does to a running gang, one node per host (Kubernetes
launch, one process a node, gloo): a cable pulled on a worker or on the control,
one direction of traffic lost, a link that flaps, a worker cut off before it
joins. Each test names what it expects and measures, with the processes it is
about (a host's torchrun agent and ranks, a node's Metaflow task), how long
after the fault each one ended; ``-s`` prints the figures (docs/failures.md).

The ``sandbox`` fixture fails a test that leaves any process on any host."""

import json
import os
import re
import time
from typing import Dict, List, Tuple

import pytest
from our_processes import torchrun_processes

from .harness import FLOWS, PlatformRun

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(150)]

GANG = os.path.join(FLOWS, "gang_flow.py")
HEARTBEAT = 8  # heartbeat_timeout of every test here (the default is 30 s)
START = 30  # start_timeout of the start-up cut (the default is 600 s)
TRYING = "still trying to reach the control node"  # the worker's line while it waits
SPIN = ["--script", "spin.py", "--nproc", "1"]  # all-reduces until stopped


def _run(sandbox, net, params, **attrs) -> PlatformRun:
    run = PlatformRun(sandbox, net, "kubernetes", GANG, params=params,
                      env={"MFTR_TORCHRUN_ATTRS": json.dumps(attrs)})
    run.prepare()
    return run


def _running(sandbox, run) -> None:
    """Every node launched and every rank in its loop; each host's torchrun is
    found (a finder that finds nothing would time every stop as instant)."""
    run.launch_all()
    sandbox.wait_for_reports("ready-", len(run.hosts), timeout=120, procs=list(run.procs.values()))
    alive = torchrun_processes(sandbox.token)
    for host in run.hosts:
        assert sum(host.holds(pid) for pid in alive) >= 2, "no agent and rank found on host %d" % host.index


def _ended(sandbox, run, since: float, timeout: float) -> Tuple[Dict[int, int], Dict[int, float], Dict[int, float]]:
    """After a fault at ``since``: every node's exit code, and how many seconds
    after the fault each host's torchrun (agent and ranks) was gone and each
    node's Metaflow task had ended."""
    gone: Dict[int, float] = {}
    deadline = since + timeout
    while len(gone) < len(run.hosts) and time.monotonic() < deadline:
        alive = torchrun_processes(sandbox.token)
        now = time.monotonic()
        for host in run.hosts:
            if host.index not in gone and not any(host.holds(pid) for pid in alive):
                gone[host.index] = round(now - since, 1)
        for i, p in run.procs.items():
            if i not in run.ended_at and p.poll() is not None:
                run.ended_at[i] = now
        time.sleep(0.1)
    codes = run.wait(timeout=max(1.0, deadline - time.monotonic()))
    ended = {i: round(run.ended_at[i] - since, 1) for i in codes}
    return codes, gone, ended


def _root_cause(log: str) -> str:
    """The control's error names the gang's root cause: ``node 0 stopped: ...``."""
    found = re.findall(r"node 0 stopped: (.*)", log)
    assert found, log[-4000:]
    return found[0]


def _figures(name: str, **figures) -> None:
    print("\nFIGURES %s: %s" % (name, json.dumps(figures, sort_keys=True)))


def _stopped_within(run, codes, gone, ended, torchrun_limit, task_limit) -> None:
    assert all(c != 0 for c in codes.values()), (codes, run.logs_summary())
    assert len(gone) == len(run.hosts) and max(gone.values()) <= torchrun_limit, (gone, run.logs_summary())
    assert max(ended.values()) <= task_limit, (ended, run.logs_summary())


def test_worker_cable_pulled(network, sandbox):
    """Mid-run, the worker host's cable is pulled. Expected: the control stops
    for lack of heartbeats, naming both sides (with two nodes it cannot tell
    which is cut off), the worker for lack of news from the control; each
    host's torchrun gone by heartbeat_timeout + 6 s, both tasks ended by
    heartbeat_timeout + 15 s."""
    net = network(2)
    run = _run(sandbox, net, SPIN, heartbeat_timeout=HEARTBEAT)
    _running(sandbox, run)
    net.hosts[1].cut_link()
    codes, gone, ended = _ended(sandbox, run, time.monotonic(), HEARTBEAT + 60)
    _figures("worker cut", torchrun_gone=gone, task_ended=ended)
    _stopped_within(run, codes, gone, ended, HEARTBEAT + 6, HEARTBEAT + 15)
    cause = _root_cause(run.node_log(0))
    assert cause.startswith("lost contact between node 0") and "node 1" in cause, cause
    assert "heard nothing from the control node" in run.node_log(1), run.logs_summary()


def test_control_cable_pulled_three_hosts(network, sandbox):
    """Mid-run, the control host's cable is pulled. Expected: node 0 hears
    neither worker from the same moment and says it is the likely one cut off,
    blaming no worker; each worker says it heard nothing from the control; all
    torchruns gone by heartbeat_timeout + 6 s, all tasks by heartbeat_timeout + 15 s."""
    net = network(3)
    run = _run(sandbox, net, SPIN, heartbeat_timeout=HEARTBEAT)
    _running(sandbox, run)
    net.hosts[0].cut_link()
    codes, gone, ended = _ended(sandbox, run, time.monotonic(), HEARTBEAT + 60)
    _figures("control cut (3 hosts)", torchrun_gone=gone, task_ended=ended)
    _stopped_within(run, codes, gone, ended, HEARTBEAT + 6, HEARTBEAT + 15)
    cause = _root_cause(run.node_log(0))
    assert "node 0" in cause and "likely the one cut off" in cause, cause
    assert "sent no heartbeat" not in cause, cause  # no worker blamed
    for i in (1, 2):
        assert "heard nothing from the control node" in run.node_log(i), run.logs_summary()


def test_one_way_loss(network, sandbox):
    """Mid-run, the worker's packets for the control are lost; the other way
    still carries packets. Expected: the control stops for lack of heartbeats,
    naming both sides. The worker hears nothing new either: TCP, its
    acknowledgements lost, only resends what the worker already has. So it
    stops on its own silence, as for a pulled cable, with the same timings."""
    net = network(2)
    control, worker = net.hosts
    run = _run(sandbox, net, SPIN, heartbeat_timeout=HEARTBEAT)
    _running(sandbox, run)
    worker.drop_to(control)
    codes, gone, ended = _ended(sandbox, run, time.monotonic(), HEARTBEAT + 60)
    _figures("one-way loss", torchrun_gone=gone, task_ended=ended)
    _stopped_within(run, codes, gone, ended, HEARTBEAT + 6, HEARTBEAT + 15)
    cause = _root_cause(run.node_log(0))
    assert cause.startswith("lost contact between node 0") and "node 1" in cause, cause
    assert "heard nothing from the control node" in run.node_log(1), run.logs_summary()


def test_flaps_are_ridden_out(network, sandbox):
    """The worker's link goes down for 2 s, comes back, then for 5 s, under
    heartbeat_timeout=8. Expected: both nodes end with rc 0, every step of
    every rank done; gloo's all-reduce stalls across each flap."""
    _ridden_out(network, sandbox, "flaps 2 s then 5 s", ((2, 5), (5, 0)), HEARTBEAT, steps=100)


@pytest.mark.timeout(240)
def test_a_flap_that_tcp_would_stretch_past_the_timeout_is_ridden_out(network, sandbox):
    """The worker's link goes down for 20 s under heartbeat_timeout=24. TCP
    resends what the gang's connection lost at 0.2 * (2^k - 1) s after it was
    first sent (more under load): the resend after 12.6 to 18.9 s falls
    inside the cut, the next comes 25.4 s or more after, so the connection
    alone reads the flap as over 26 s of silence and the gang stopped. Each
    node hearing the other on a fresh connection (gang/probing.py) rides it
    out: both nodes end with rc 0, every step done."""
    _ridden_out(network, sandbox, "flap 20 s at heartbeat_timeout=24", ((20, 0),), 24, steps=150)


def _ridden_out(network, sandbox, name, flaps, heartbeat, steps):
    """``flaps``: (seconds down, seconds up after) of the worker's link, an
    all-reduce every 0.2 s for ``steps`` steps around them."""
    net = network(2)
    run = _run(sandbox, net, ["--script", "steps.py", "--nproc", "1",
                              "--script-args", json.dumps({"steps": steps})], heartbeat_timeout=heartbeat)
    _running(sandbox, run)
    for seconds, after in flaps:
        net.hosts[1].cut_link()
        time.sleep(seconds)
        net.hosts[1].restore_link()
        time.sleep(after)  # the first stall is over before the second flap
    codes = run.wait(timeout=90)
    reports = sandbox.reports("steps-")
    _figures(name, stalls={r: rep["stalls"] for r, rep in reports.items()})
    assert codes == {0: 0, 1: 0}, run.logs_summary()
    assert sorted(reports) == [0, 1] and all(r["steps"] == steps for r in reports.values()), reports


def test_start_up_cut(network, sandbox):
    """The worker host's cable is pulled before its node starts, with
    start_timeout=30. Expected: the worker says, within a minute and then
    every 15 s, what it is trying (the control's address and port) and the
    last error; the control says who is missing; both tasks end by
    start_timeout + 15 s after their launch."""
    net = network(2)
    run = _run(sandbox, net, SPIN, heartbeat_timeout=HEARTBEAT, start_timeout=START)
    net.hosts[1].cut_link()
    run.launch_all()
    first_said = None  # seconds after its launch the worker first said what it tries
    deadline = time.monotonic() + START + 60
    while len(run.ended_at) < 2 and time.monotonic() < deadline:
        if first_said is None and _lines(run.node_log(1), TRYING):
            first_said = round(time.monotonic() - run.launched_at[1], 1)
        for i, p in run.procs.items():
            if i not in run.ended_at and p.poll() is not None:
                run.ended_at[i] = time.monotonic()
        time.sleep(0.2)
    codes = run.wait(timeout=1)
    ended = {i: round(run.ended_at[i] - run.launched_at[i], 1) for i in codes}
    trying = _lines(run.node_log(1), TRYING)
    _figures("start-up cut", task_ended_after_launch=ended, worker_first_said=first_said, worker_said=trying)
    assert first_said is not None and first_said <= 60, (first_said, run.node_log(1))
    assert all(c != 0 for c in codes.values()), run.logs_summary()
    assert max(ended.values()) <= START + 15, (ended, run.logs_summary())
    assert trying and all(net.hosts[0].ip in line and "last error" in line for line in trying), run.node_log(1)
    assert "node 1 missing" in run.node_log(0), run.node_log(0)
    assert "could not reach the control node" in run.node_log(1), run.node_log(1)


def _lines(log: str, needle: str) -> List[str]:
    return [line for line in log.splitlines() if needle in line]
