"""runtime/stop.py: one node told to stop is the gang's stop, with one grace."""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time

import pytest
from proc_helpers import PY, is_running, wait_until

from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.record import attempts
from metaflow_extensions.torchrun.plugins.torchrun.base.timeouts import NOTICE_POLL, SPOT_MARGIN, VERDICT_WAIT
from metaflow_extensions.torchrun.plugins.torchrun.runtime.stop import (
    GangStop,
    grace_for,
    preempted,
    read_notice,
    seconds_left,
)
from metaflow_extensions.torchrun.plugins.torchrun.runtime.supervisor import GracefulStop, Supervisor

NOW = 1_800_000_000.0


def _iso(epoch: float) -> str:
    """As the instance metadata service gives it (and Metaflow's monitor writes it)."""
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class TestSpotNotice:
    def test_the_time_left_is_read_from_the_monitors_text(self):
        assert seconds_left(_iso(NOW + 120), NOW) == pytest.approx(120)
        assert seconds_left("2027-01-15T08:00:00+00:00", NOW) is not None
        assert seconds_left("not a time", NOW) is None

    def test_the_grace_is_capped_by_the_time_left(self):
        assert grace_for(60, _iso(NOW + 30), NOW) == pytest.approx(30 - SPOT_MARGIN)
        assert grace_for(20, _iso(NOW + 120), NOW) == 20  # shutdown_grace is the lower
        assert grace_for(60, _iso(NOW - 5), NOW) == 0  # already past: stop at once
        assert grace_for(60, "garbled", NOW) == 60  # still a stop, with the full grace
        assert grace_for(45, None, NOW) == 45

    def test_the_file_as_the_monitor_writes_it(self, tmp_path):
        path = tmp_path / "spot_termination_notice"
        assert read_notice(str(path)) is None  # no file: no notice
        path.write_text("")
        assert read_notice(str(path)) is None  # truncated, not written yet
        path.write_text("2026-11-25T06:30:00Z")  # open("w").write(termination_time), no newline
        assert read_notice(str(path)) == "2026-11-25T06:30:00Z"
        assert read_notice(None) is None


class FakeGang:
    """What GangStop needs of the gang client: the reports it sends, and a
    verdict that comes back (or not, when the control is gone)."""

    def __init__(self, answers=True):
        self.sent = []
        self.cause = None
        self.answers = answers
        self.waited = []

    def report(self, cause):
        self.sent.append(cause)
        if self.answers:
            self.cause = cause

    def wait(self, seconds):
        self.waited.append(seconds)


def _stop(gang, node=1, grace=45.0, notice=None):
    return GangStop(node, 0, grace, report=gang.report, verdict=lambda: gang.cause, wait_verdict=gang.wait,
                    notice=notice)


class TestGangStop:
    def test_a_told_node_tells_the_gang_and_stops_with_it(self):
        gang = FakeGang()
        stop = _stop(gang)
        assert stop.check() is None
        stop.told("SIGTERM")
        assert [c.kind for c in gang.sent] == [CauseKind.PREEMPTED] and gang.waited == [VERDICT_WAIT]
        order = stop.check()
        assert isinstance(order, GracefulStop) and order.grace == 45
        assert order.reason.startswith("node 1 was told to stop (SIGTERM")
        stop.told("SIGTERM")  # a second signal tells nobody again
        assert len(gang.sent) == 1

    def test_a_peers_stop_is_graceful_with_the_peers_grace(self):
        gang = FakeGang()
        gang.cause = preempted(3, "SIGTERM", 12.5, 45)
        order = _stop(gang, node=0).check()
        assert order == GracefulStop(gang.cause.summary, 12.5)

    def test_a_failure_keeps_the_fast_stop(self):
        gang = FakeGang()
        gang.cause = Cause(CauseKind.RANK_FAILED, "node 1: rank 3 raised ValueError", node_index=1)
        assert _stop(gang, node=0).check() == "node 1: rank 3 raised ValueError"  # a plain reason: fast

    def test_no_verdict_the_node_stops_its_own_after_the_wait(self, monkeypatch):
        gang = FakeGang(answers=False)
        stop = _stop(gang)
        clock = [100.0]
        monkeypatch.setattr(time, "monotonic", lambda: clock[0])
        stop.told("KeyboardInterrupt")
        assert stop.check() is None
        clock[0] += VERDICT_WAIT
        order = stop.check()
        assert isinstance(order, GracefulStop) and "Ctrl-C" in order.reason and order.grace == 45

    def test_a_spot_notice_is_a_stop_capped_by_the_time_left(self, tmp_path):
        path = tmp_path / "notice"
        gang = FakeGang()
        stop = _stop(gang, notice=str(path), grace=600)
        assert stop.check() is None
        when = _iso(time.time() + 100)
        path.write_text(when)
        time.sleep(NOTICE_POLL)
        order = stop.check()
        assert isinstance(order, GracefulStop)
        assert 100 - SPOT_MARGIN - 2 < order.grace <= 100 - SPOT_MARGIN
        cause = gang.sent[0]
        assert cause.message == when and cause.node_index == 1
        assert "node 1 got a spot termination notice (the instance terminates at %s)" % when in cause.summary
        assert "capped by the time left" in cause.summary


class TestTheCause:
    def test_grace_crosses_the_wire_checked(self):
        cause = preempted(2, "SIGTERM", 30.0, 30.0)
        back = Cause.from_wire(cause.to_wire())
        assert back is not None and back.kind is CauseKind.PREEMPTED and back.grace == 30.0
        for bad, read in ((float("inf"), None), ("30", None), (10**400, None), (-4, 0.0), (10**9, 86400.0)):
            data = dict(cause.to_wire(), grace=bad)
            assert Cause.from_wire(data).grace == read, bad

    def test_a_preemption_is_infrastructure_for_retry_on(self):
        """As attempt k+1 reads attempt k's stored record."""
        stored = {"cause": preempted(1, "SIGTERM", 30.0, 30.0).to_wire()}
        previous = attempts.Previous.from_wire(stored)
        assert previous.cause.kind is CauseKind.PREEMPTED and previous.cause.grace == 30.0
        assert attempts.user_code_failure(previous.cause) is None
        assert attempts.refusal("infrastructure", 1, previous) is None  # retried
        own_code = Cause(CauseKind.STEP_FAILED, "node 1 failed in its step", node_index=1, exc_type="ValueError",
                         traceback='File "train.py", line 3, in <module>\n')
        assert attempts.refusal("infrastructure", 1, attempts.Previous.from_wire({"cause": own_code.to_wire()}))


SLOW_SAVE = r"""
import signal, sys, time
def save(signum, frame):
    time.sleep(float(sys.argv[2]))
    open(sys.argv[1], "w").write("saved")
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


class TestSupervisorsGracefulStop:
    """The agent stands in for torchrun's: the supervisor's own deadline is what is tested."""

    def _run(self, tmp_path, procs, reason):
        saved = tmp_path / "saved"
        seen = []
        sup = Supervisor([PY, "-c", SLOW_SAVE, str(saved), "2"], grace_seconds=0.5, shutdown_grace=1,
                         stdout_sink=seen.append, stderr_sink=lambda c: None)
        with sup:
            procs.add(sup.proc.pid)
            assert wait_until(lambda: b"ready" in b"".join(seen), 30)
            sup.wait(should_stop=lambda: reason, interval=0.05)
        assert not is_running(sup.proc.pid)
        return saved.exists()

    @pytest.mark.timeout(60)
    def test_a_graceful_stop_waits_its_grace(self, tmp_path, procs):
        assert self._run(tmp_path, procs, GracefulStop("node 1 was told to stop", 10.0))

    @pytest.mark.timeout(60)
    def test_a_failure_stops_fast(self, tmp_path, procs):
        assert not self._run(tmp_path, procs, "node 1 failed")

    @pytest.mark.timeout(60)
    def test_sigterm_with_a_gang_tells_it_and_does_not_raise(self, tmp_path, procs):
        told = []
        sup = Supervisor([PY, "-c", SLOW_SAVE, str(tmp_path / "saved"), "0"], grace_seconds=0.5,
                         shutdown_grace=5, on_told=told.append, stdout_sink=lambda c: None,
                         stderr_sink=lambda c: None)
        with sup:
            procs.add(sup.proc.pid)
            timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
            timer.start()
            try:
                sup.wait(should_stop=lambda: GracefulStop("told", 5.0) if told else None, interval=0.05)
            finally:
                timer.cancel()
        assert told == ["SIGTERM"] and sup.signalled == signal.SIGTERM
        assert (tmp_path / "saved").exists()


class TimeoutException(Exception):
    """Named as Metaflow's @timeout names the exception its SIGALRM handler raises."""


@pytest.mark.timeout(60)
def test_timeout_raised_by_a_signal_handler_is_a_gang_stop_then_goes_on_up(tmp_path, procs):
    """Metaflow's @timeout raises in the task's main thread while the call
    waits: the gang is told, the ranks get the grace, then the error goes on."""
    told = []
    sup = Supervisor([PY, "-c", SLOW_SAVE, str(tmp_path / "saved"), "1"], grace_seconds=0.2,
                     shutdown_grace=8, on_told=told.append, stdout_sink=lambda c: None, stderr_sink=lambda c: None)

    def alarm(signum, frame):
        raise TimeoutException("step timed out")

    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        with sup:
            procs.add(sup.proc.pid)
            signal.setitimer(signal.ITIMER_REAL, 0.8)
            with pytest.raises(TimeoutException):
                sup.wait(should_stop=lambda: GracefulStop("told", 8.0) if told else None, interval=0.05)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert told == ["TimeoutException"]
    assert (tmp_path / "saved").exists()  # 1 s of save: more than a failure's 0.2 s
