"""session.py: the step's gang in its phases, with real sockets and threads.

Two or three sessions in this process play the nodes of one step; the control's
session hosts the real gang service on 127.0.0.1.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from metaflow_extensions.torchrun.plugins.torchrun.base import timeouts
from metaflow_extensions.torchrun.plugins.torchrun.cause import CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.errors import GangAborted
from metaflow_extensions.torchrun.plugins.torchrun.gang.identity import GangIdentity
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import StepDefaults
from metaflow_extensions.torchrun.plugins.torchrun.gang.ports import find_free_port
from metaflow_extensions.torchrun.plugins.torchrun.runtime.context import step_context
from metaflow_extensions.torchrun.plugins.torchrun.runtime.session import GangSession, Phase
from metaflow_extensions.torchrun.plugins.torchrun.gang.topology import Topology
from metaflow_extensions.torchrun.plugins.torchrun.base.knobs import Knobs
from proc_helpers import wait_until

GUARD = 10.0


@pytest.fixture(autouse=True)
def short_linger(monkeypatch):
    """A failed control lingers for nodes that have not heard; tests that do not
    look at that should not wait for it at teardown."""
    monkeypatch.setattr(timeouts, "LINGER", 0.2)


# Each session's join starts its warm process, which imports torch (about 1
# CPU-s a second, until close kills it: the CPU a test waiting 3 s for a join or
# a start_timeout spent); these tests are of the gang's phases, and
# test_warm_start.py and the flows test the warm process.
NO_WARM_PROCESS = Knobs(warm_start=False)


@pytest.fixture
def gang():
    port = find_free_port()
    identity = GangIdentity("F", uuid.uuid4().hex[:8], "train", "2", 0)
    made = []

    def make(node, num_nodes=2, **defaults):
        topo = Topology(num_nodes=num_nodes, node_index=node, main_addr="127.0.0.1", ports=(port,),
                        is_local=True)
        s = GangSession(step_context(identity, StepDefaults(**{"knobs": NO_WARM_PROCESS, **defaults}), topo,
                                     b"test secret of 32 bytes, at least"))
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def _fail(session, error):
    """The step's code raised ``error`` (with a traceback, as a real one has)."""
    try:
        raise error
    except BaseException as e:  # noqa: BLE001
        session.step_failed(e)


def _in_thread(fn):
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


class TestJoin:
    def test_the_control_hosts_the_service_and_both_join(self, gang):
        control, worker = gang(0), gang(1)
        control.join()
        worker.join()
        assert control.client.speaks_for_gang and not worker.client.speaks_for_gang
        assert control.client.wait_joined() and worker.client.wait_joined()
        assert control.phase is Phase.IN_STEP
        # What every call needs of the host, found once as the step joins (runtime/call_launch.py).
        assert control.context.route[0] and worker.context.route == control.context.route
        assert control.context.host_base and os.path.isdir(control.context.host_base)

    def test_a_worker_starting_first_joins_in_the_background(self, gang):
        worker = gang(1)
        started = time.monotonic()
        worker.join()  # nobody listens yet: waits JOIN_WAIT at most, then goes on
        assert time.monotonic() - started < timeouts.JOIN_WAIT + 1
        assert not worker.client.joined.is_set()
        control = gang(0)
        control.join()
        assert worker.client.wait_joined()


class TestStepEnd:
    def test_both_succeed_and_the_control_waits_for_the_worker(self, gang):
        control, worker = gang(0), gang(1)
        control.join()
        worker.join()
        t, box = _in_thread(control.step_succeeded)
        time.sleep(0.5)
        assert t.is_alive(), "the control must wait for every node to leave"
        worker.step_succeeded()
        t.join(GUARD)
        assert not t.is_alive() and "error" not in box
        assert control.phase is Phase.LEFT

    def test_a_worker_failing_before_its_call_fails_the_control(self, gang):
        control, worker = gang(0), gang(1)
        control.join()
        worker.join()
        t, box = _in_thread(control.step_succeeded)
        _fail(worker, RuntimeError("no data"))
        t.join(GUARD)
        error = box.get("error")
        assert isinstance(error, GangAborted)
        assert error.cause.kind is CauseKind.STEP_FAILED and error.cause.node_index == 1
        assert "node 1 failed in its step before current.torch.run: RuntimeError: no data" in str(error)
        # The traceback travels (the card and the record have it); on a local run
        # the worker's own error in the same log shows it, not this one again.
        assert error.cause.traceback and "in _fail" in error.cause.traceback
        assert "in _fail" not in str(error) and "its error in this log has the traceback" in str(error)

    def test_an_echo_is_not_reported_as_a_new_cause(self, gang):
        control, worker = gang(0), gang(1)
        control.join()
        worker.join()
        _fail(control, RuntimeError("first"))
        assert worker.client.wait_for_verdict(GUARD) is not None
        worker.step_failed(GangAborted(1, worker.cause))
        assert control.cause.summary.startswith("node 0 failed in its step")

    def test_a_node_leaving_without_the_call_the_other_waits_in(self, gang):
        control, worker = gang(0), gang(1)
        control.join()
        worker.join()
        t, box = _in_thread(lambda: control.client.enter_call(0, "train.py"))
        try:
            worker.step_succeeded()
        except GangAborted as e:
            # The verdict may reach the leaving node before its step has ended.
            assert e.cause.kind is CauseKind.LEFT_EARLY
        t.join(GUARD)
        # The control went at once (its torchrun would be running): the gang
        # stops it when node 1 leaves without the call.
        assert wait_until(lambda: control.cause is not None, GUARD)
        assert control.cause.kind is CauseKind.LEFT_EARLY
        assert "node 1 ended its step after 0 calls" in control.cause.summary


class TestCauseText:
    @pytest.mark.parametrize(
        "calls, in_call, where",
        [
            (0, False, "before current.torch.run"),
            (1, True, "in call 1 of current.torch.run"),
            (2, False, "after call 2 of current.torch.run"),
        ],
    )
    def test_where_the_step_failed(self, gang, calls, in_call, where):
        s = gang(1)
        s.calls_made = calls
        s.phase = Phase.IN_CALL if in_call else Phase.IN_STEP
        cause = s.step_cause(ValueError("bad\nsecond line"))
        assert cause.summary == "node 1 failed in its step %s: ValueError: bad" % where
        assert cause.message == "bad\nsecond line" and cause.exc_type == "ValueError"

    def test_an_error_from_a_call_is_said_in_that_call_after_the_phase_reset(self, gang):
        """The cause is written after ``in_call`` has left its phase: issue 35
        saw "after call 1" for an error raised inside call 1."""
        s = gang(1)
        error = RuntimeError("told to stop")
        with pytest.raises(RuntimeError):
            with s.in_call():
                raise error
        assert s.phase is Phase.IN_STEP
        assert "in call 1 of current.torch.run" in s.step_cause(error).summary
        # A later error of the step's own code, after the call, is said as after it.
        assert "after call 1 of current.torch.run" in s.step_cause(ValueError("later")).summary


class TestInterrupt:
    def test_an_abort_interrupts_the_steps_own_code(self, gang):
        control, worker = gang(0), gang(1)
        control.join()
        worker.join()
        assert worker.client.wait_joined()

        def fail_control_soon():
            assert wait_until(lambda: worker._in_user_code, GUARD)  # the abort comes while the code runs
            _fail(control, OSError("disk full"))

        threading.Thread(target=fail_control_soon, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(GangAborted) as info:
            with worker.user_code():
                time.sleep(30)
        assert time.monotonic() - started < 5
        assert "node 0 failed in its step before current.torch.run: OSError: disk full" in str(info.value)

    def test_no_interrupt_inside_a_call(self, gang):
        control, worker = gang(0), gang(1)
        control.join()
        worker.join()
        assert worker.client.wait_joined()
        with pytest.raises(GangAborted):  # raised when the call ends, not inside it
            with worker.user_code():
                with worker.in_call() as index:
                    assert index == 0
                    _fail(control, OSError("x"))
                    assert worker.client.wait_for_verdict(GUARD) is not None
                    time.sleep(0.3)  # a signal here would raise inside the call
                    inside = True
        assert inside and worker.calls_made == 1

    def test_a_gang_already_failed_fails_the_step_at_once(self, gang):
        control, worker = gang(0), gang(1)
        control.join()
        worker.join()
        _fail(control, OSError("x"))
        assert worker.client.wait_for_verdict(GUARD) is not None
        with pytest.raises(GangAborted):
            with worker.user_code():
                pytest.fail("the step's code must not run")


class TestLinger:
    def test_a_failed_control_waits_for_a_late_node_to_hear(self, gang, monkeypatch):
        monkeypatch.setattr(timeouts, "LINGER", 15.0)
        control = gang(0)
        control.join()
        _fail(control, OSError("x"))
        late = gang(1)
        t, box = _in_thread(control.close)
        assert wait_until(lambda: control.phase is Phase.LEFT, GUARD)  # closing: the node joins late
        late.join()
        assert late.client.wait_for_verdict(GUARD).kind is CauseKind.STEP_FAILED
        late.step_failed(GangAborted(1, late.cause))
        t.join(GUARD)
        assert not t.is_alive()

    def test_the_gang_is_closed_once(self, gang, monkeypatch):
        """The step's wrapper and ``task_finished`` both close it: the second
        close finds nothing to do, and does not linger again."""
        monkeypatch.setattr(timeouts, "LINGER", 3.0)
        control = gang(0)
        control.join()
        _fail(control, OSError("x"))
        started = time.monotonic()
        control.close()  # lingers: node 1 has not heard
        assert time.monotonic() - started >= 3.0
        started = time.monotonic()
        control.close()
        assert time.monotonic() - started < 2.0

    def test_no_linger_for_nodes_whose_start_timeout_has_passed(self, gang, monkeypatch):
        """Nodes missing at start_timeout have given up on their side too:
        nobody is left to hear the cause late."""
        monkeypatch.setattr(timeouts, "LINGER", 15.0)
        control = gang(0, start_timeout=3.0)  # a linger would last this long
        control.join()
        assert wait_until(lambda: control.cause is not None, GUARD)
        assert control.cause.kind is CauseKind.NEVER_JOINED
        started = time.monotonic()
        control.close()
        assert time.monotonic() - started < 2.0

    def test_the_linger_is_bounded(self, gang, monkeypatch):
        monkeypatch.setattr(timeouts, "LINGER", 0.5)
        control = gang(0)
        control.join()
        _fail(control, OSError("x"))
        started = time.monotonic()
        control.close()
        assert time.monotonic() - started < 3
