"""runtime/local_nodes.py and runtime/node_tasks.py: a local control's nodes.

A failed control stops its node subprocesses beside its own end, not before
it; a node whose task ends before it joined ends the gang at once, named with
its exit and last lines; the control ends with the runtime that started it;
the venv check asks PATH's `python` itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from gang_net import GUARD, new_config
from proc_helpers import is_running, wait_until
from metaflow_extensions.torchrun.plugins.torchrun.cause import CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.errors import GangAborted
from metaflow_extensions.torchrun.plugins.torchrun.gang.membership import NodeEnd
from metaflow_extensions.torchrun.plugins.torchrun.gang.membership import Membership
from metaflow_extensions.torchrun.plugins.torchrun.runtime.local_nodes import (
    RUNTIME_PID_ENV,
    stop_local_nodes,
    worker_python_problem,
)
from metaflow_extensions.torchrun.plugins.torchrun.runtime.node_tasks import KEPT_LINES, NodeTasks

# Looks like a local node to stop_local_nodes (`... step ... ubf_task ...`); ignores SIGTERM.
NODE = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


def test_the_wait_runs_beside_the_caller_and_ends_every_node():
    node = subprocess.Popen([sys.executable, "-c", NODE, "step", "train", "--ubf-context", "ubf_task"])
    try:
        time.sleep(0.3)  # started, its handler set
        began = time.monotonic()
        stopping = stop_local_nodes(settle=0.5, grace=0.5)
        assert time.monotonic() - began < 0.5  # the caller goes on: its record, its card
        assert node.poll() is None
        stopping.join(timeout=10)
        assert not stopping.is_alive()
        assert node.wait(timeout=5) == -9  # SIGTERM ignored, then SIGKILL
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()


def test_no_nodes_no_wait():
    stopping = stop_local_nodes(settle=5.0, grace=5.0)
    stopping.join(timeout=2)
    assert not stopping.is_alive()


# -- the venv check: can PATH's `python` import what a node needs? --------------------


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the tests run in a venv; its base interpreter is the case")
def test_the_venvs_own_base_interpreter_outside_it_is_refused_with_the_fix(tmp_path):
    """The binary the venv was made from, on PATH outside the venv: the same
    file as this task's Python, without the venv's packages."""
    base = os.path.realpath(sys.executable)
    (tmp_path / "python").symlink_to(base)
    problem = worker_python_problem(str(tmp_path), sys.executable)
    assert problem is not None
    assert "No module named 'metaflow'" in problem, problem
    assert "Fix: activate the environment this flow runs in" in problem
    assert "`python` on PATH is %s" % (tmp_path / "python") in problem


def test_pythons_beside_this_one_pass_without_a_subprocess(tmp_path, monkeypatch):
    import subprocess as sp

    def no_probe(*a, **k):
        raise AssertionError("probed a python of this task's own bin directory")

    monkeypatch.setattr(sp, "run", no_probe)
    assert worker_python_problem(os.path.dirname(sys.executable), sys.executable) is None


def test_no_python_on_path(tmp_path):
    problem = worker_python_problem(str(tmp_path), sys.executable)
    assert problem is not None and "there is no `python` on PATH" in problem


# -- a node's task seen to end before it joined ---------------------------------------


def test_a_node_that_ended_before_joining_is_named_with_its_exit_and_last_lines():
    members = Membership(new_config(3))
    cause = members.saw_ends(lambda: {2: NodeEnd(-9), 1: NodeEnd(1, ("Traceback ...", "", "ImportError: no x"))})
    assert cause is not None and cause.kind is CauseKind.NODE_LOST and cause.node_index == 1
    assert cause.summary == "node 1's task ended before it joined the gang (exit code 1)"
    assert cause.exit_code == 1
    assert cause.message == "its last lines of output:\n    Traceback ...\n    ImportError: no x"
    signalled = Membership(new_config(2)).saw_ends(lambda: {1: NodeEnd(-9)})
    assert signalled is not None and "(killed by signal SIGKILL)" in signalled.summary
    assert signalled.message == "it wrote nothing on stderr"


def test_the_error_points_at_the_last_lines_a_local_log_shows_already_and_says_them_elsewhere():
    """On a local run the control passed the node's stderr on into the same
    log: the error says they are above instead of repeating them; a node that
    wrote nothing, or a log of its own, gets the message itself."""
    said = Membership(new_config(2)).saw_ends(lambda: {1: NodeEnd(3, ("ImportError: no x",))})
    assert said is not None
    local = str(GangAborted(0, said, same_log=True))
    assert "ImportError: no x" not in local and "its last lines of output are above, as it wrote them" in local
    assert "    ImportError: no x" in str(GangAborted(0, said, same_log=False))
    silent = Membership(new_config(2)).saw_ends(lambda: {1: NodeEnd(-9)})
    assert silent is not None and "it wrote nothing on stderr" in str(GangAborted(0, silent, same_log=True))


def test_a_node_that_joined_is_not_named_by_its_end_and_ended_nodes_count_as_heard():
    members = Membership(new_config(3))
    members.joined_at.update({0: 1.0, 1: 1.0})
    assert members.saw_ends(None) is None
    assert members.saw_ends(lambda: {1: NodeEnd(0)}) is None and not members.all_heard
    assert members.saw_ends(lambda: {2: NodeEnd(3), 7: NodeEnd(3)}) is not None  # an index outside the gang is ignored
    assert members.all_heard and set(members.ended) == {2}
    assert members.saw_ends(lambda: {2: NodeEnd(3)}) is None  # every node heard: not asked again


def _node(code: str) -> list:
    return [sys.executable, "-c", code]


def test_node_tasks_see_an_exit_and_keep_the_last_lines_of_stderr():
    nodes = NodeTasks()
    said = "import sys\nfor i in range(30): sys.stderr.write('line %d\\n' % i)\nsys.exit(3)"
    nodes.start(1, _node(said), dict(os.environ))
    nodes.start(2, _node("import time; time.sleep(60)"), dict(os.environ))
    try:
        assert wait_until(lambda: 1 in nodes.ended(), GUARD)
        end = nodes.ended()[1]
        assert end.exit_code == 3
        assert end.last_lines == tuple("line %d" % i for i in range(30 - KEPT_LINES, 30))
        assert set(nodes.running()) == {2} and 2 not in nodes.ended()
        os.kill(nodes.procs[2].pid, signal.SIGKILL)
        assert wait_until(lambda: 2 in nodes.ended(), GUARD)
        assert nodes.ended()[2] == NodeEnd(-9, ())
    finally:
        for proc in nodes.procs.values():
            if proc.poll() is None:
                proc.kill()
        nodes.wait()


def test_a_node_started_after_every_earlier_one_ended_is_still_pumped():
    """The pump ends with the last stream it had: a node that died before the
    next one started left none (a start then met a closed selector)."""
    nodes = NodeTasks()
    nodes.start(1, _node("import sys; sys.stderr.write('gone\\n'); sys.exit(3)"), dict(os.environ))
    try:
        assert wait_until(lambda: 1 in nodes.ended() and nodes._pump is None, GUARD)
        nodes.start(2, _node("import sys; sys.stderr.write('later\\n'); sys.exit(4)"), dict(os.environ))
        assert wait_until(lambda: 2 in nodes.ended(), GUARD)
        assert nodes.ended()[2] == NodeEnd(4, ("later",))
    finally:
        for proc in nodes.procs.values():
            if proc.poll() is None:
                proc.kill()
        nodes.wait()


def test_the_gang_service_ends_the_gang_when_a_node_task_ends_before_joining(net):
    ends = {}
    server = net.server(2, start_timeout=600, hooks=dict(node_ends=lambda: dict(ends)))
    (c0,) = net.join(server, [0])
    time.sleep(0.5)
    assert server.cause is None and not server.everyone_heard()
    ends[1] = NodeEnd(3, ("ModuleNotFoundError: No module named 'metaflow'",))
    assert wait_until(lambda: c0.cause is not None, GUARD)
    assert c0.cause.kind is CauseKind.NODE_LOST and c0.cause.node_index == 1
    assert "No module named 'metaflow'" in (c0.cause.message or "")
    assert server.everyone_heard()  # no linger for a node whose task is gone


# -- the control ends with the runtime that started it ------------------------------

# A bound for a broken start, never a measure: a Python that imports metaflow, on a loaded machine.
START_GUARD = 60.0
# A "runtime" that starts a "control" (which asks to end with it, then waits),
# lives ``argv[3]`` seconds and exits.
_RUNTIME = """
import os, subprocess, sys, time
env = dict(os.environ, %s=str(os.getpid()))
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], env=env)
time.sleep(float(sys.argv[3]))
""" % RUNTIME_PID_ENV
_CONTROL = """
import os, sys, time
import metaflow
from metaflow_extensions.torchrun.plugins.torchrun.runtime import local_nodes
open(sys.argv[1], "w").write(str(os.getpid()))
local_nodes._end_with_runtime()
time.sleep(60)
"""


@pytest.mark.parametrize("runtime_lives", [3.0, 0.0])
def test_a_control_ends_with_its_runtime_even_one_gone_before_it_asked(tmp_path, runtime_lives):
    """A runtime that dies while the control waits (PR_SET_PDEATHSIG), and one
    gone before the control asked (the control then ends itself)."""
    pid_file = tmp_path / "control.pid"
    runtime = subprocess.Popen([sys.executable, "-c", _RUNTIME, _CONTROL, str(pid_file), str(runtime_lives)])
    runtime.wait(timeout=GUARD + runtime_lives)
    # Its imports (metaflow, and with it every module of ours) come first, and take seconds under CI's load:
    # GUARD counts from there, the time the control takes to notice its runtime gone.
    assert wait_until(lambda: pid_file.exists() and pid_file.read_text(), START_GUARD), "the control never started"
    control = int(pid_file.read_text())
    try:
        assert wait_until(lambda: not is_running(control), GUARD), "the control outlived its runtime"
    finally:
        if is_running(control):
            os.kill(control, signal.SIGKILL)


# -- the control's own start, and its stop of nodes that never joined ----------------

def test_own_start_takes_metaflows_local_start_only():
    import functools

    from metaflow.plugins import parallel_decorator

    from metaflow_extensions.torchrun.plugins.torchrun.runtime import local_nodes

    args = ("flow", "env", print, 0, "inputs")
    metaflows = functools.partial(parallel_decorator._local_multinode_control_task_step_func, *args)
    ours = local_nodes.own_start(metaflows)
    assert ours.func is local_nodes.run_local_control and ours.args == args
    other = functools.partial(print, 1)
    assert local_nodes.own_start(other) is other  # another Metaflow's shape: left as it is
    assert local_nodes.own_start(print) is print


class _Joined:
    """The gang service as the stop asks it: who has not joined."""

    def __init__(self, missing):
        self._missing = missing

    def missing(self):
        return list(self._missing)


def test_a_node_that_never_joined_is_stopped_at_once_the_others_given_time(monkeypatch):
    from metaflow_extensions.torchrun.plugins.torchrun.runtime import local_nodes

    nodes = NodeTasks()
    nodes.start(1, _node("import time; time.sleep(60)"), dict(os.environ))
    nodes.start(2, _node("import time; time.sleep(60)"), dict(os.environ))
    monkeypatch.setattr(local_nodes, "_started", nodes)
    try:
        stopping = stop_local_nodes(_Joined([2]).missing, settle=60.0, grace=1.0)
        assert wait_until(lambda: nodes.procs[2].poll() is not None, GUARD)
        assert nodes.procs[2].returncode == -signal.SIGTERM
        assert nodes.procs[1].poll() is None  # joined: it has its record to write first
    finally:
        for proc in nodes.procs.values():
            if proc.poll() is None:
                proc.kill()
        stopping.join(timeout=GUARD)
        nodes.wait()


# -- the failure screen: the root cause's words before the echoes -------------------

def test_the_echoes_wait_for_the_node_that_says_the_cause():
    """Pure: after the verdict, the node that says the root cause passes at once; the others wait for its end,
    or (the control says it) for the release; a root already ended has said it: nothing is held."""
    from metaflow_extensions.torchrun.plugins.torchrun.runtime.node_tasks import Echoes

    echoes = Echoes()
    assert echoes.feed(2, b"before\n") == b"before\n"  # no verdict yet: as it comes
    echoes.stopped(1, {1, 2})
    assert echoes.feed(2, b"node 2 stopped because node 1 failed first\n") == b""
    assert echoes.feed(1, b"@torchrun job failed: rank 3\n") == b"@torchrun job failed: rank 3\n"
    assert echoes.ended(2) == b""
    assert echoes.ended(1) == b"node 2 stopped because node 1 failed first\n"
    assert echoes.feed(2, b"after\n") == b"after\n"
    echoes.stopped(2, {2})  # one verdict: once released, never held again
    assert echoes.feed(1, b"x\n") == b"x\n"
    control = Echoes()
    control.stopped(None, {1, 2})
    assert control.feed(1, b"a\n") == b"" and control.feed(2, b"b\n") == b"" and control.ended(1) == b""
    assert control.release() == b"a\nb\n" and control.feed(1, b"c\n") == b"c\n"
    gone = Echoes()
    gone.stopped(1, {2})
    assert gone.feed(2, b"echo\n") == b"echo\n"
    bounded = Echoes(limit=8)
    bounded.stopped(None, {1})
    assert bounded.feed(1, b"12345\n") == b"" and bounded.feed(1, b"67890\n") == b"12345\n67890\n"


def test_who_says_the_cause_on_a_local_console():
    from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause
    from metaflow_extensions.torchrun.plugins.torchrun.runtime.node_tasks import speaker

    assert speaker(Cause(CauseKind.RANK_FAILED, "x", node_index=1)) == 1
    assert speaker(Cause(CauseKind.STEP_FAILED, "x", node_index=2)) == 2
    assert speaker(Cause(CauseKind.RANK_FAILED, "x", node_index=0)) is None  # the control's own error
    assert speaker(Cause(CauseKind.NODE_LOST, "x", node_index=1)) is None  # a lost node says nothing
    assert speaker(Cause(CauseKind.UNRESPONSIVE, "x", node_index=1)) is None
    assert speaker(Cause(CauseKind.HANG, "x")) is None


def _echo_node(go: str, text: str) -> list:
    """A node task that writes ``text`` on stderr once ``go`` exists (after the verdict, as an echo does)."""
    return _node("import os, sys, time\nwhile not os.path.exists(%r): time.sleep(0.01)\nsys.stderr.write(%r)"
                 % (go, text))


def _read_all(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return b""


def test_a_workers_echo_of_the_controls_failure_follows_the_controls_error(tmp_path):
    """The real node tasks' stderr, through the control: the verdict is the control's own failure, so
    node 1's echo is held until the control's error is out (``release``, at its exit or as its step goes on)."""
    from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause

    out_r, out_w = os.pipe()
    go = str(tmp_path / "go")
    nodes = NodeTasks(out=out_w)
    nodes.start(1, _echo_node(go, "node 1 stopped because node 0 failed first\n"), dict(os.environ))
    try:
        nodes.stopped(Cause(CauseKind.RANK_FAILED, "node 0, rank 1: ValueError", node_index=0))
        open(go, "w").close()
        assert wait_until(lambda: 1 in nodes.ended(), GUARD)
        assert _read_all(out_r) == b""  # its task ended, its line read: still held
        os.write(out_w, b"@torchrun job failed: node 0, rank 1\n")  # the control's error, as Metaflow prints it
        nodes.release()
        assert _read_all(out_r) == b"@torchrun job failed: node 0, rank 1\nnode 1 stopped because node 0 failed first\n"
    finally:
        for proc in nodes.procs.values():
            if proc.poll() is None:
                proc.kill()
        nodes.wait()
        os.close(out_r)
        os.close(out_w)


def test_a_worker_that_failed_first_speaks_before_the_other_workers_echoes(tmp_path):
    """Node 2 echoes before node 1, whose rank failed, has said it: node 2's line waits for node 1's end."""
    from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause

    out_r, out_w = os.pipe()
    echo, root = str(tmp_path / "echo"), str(tmp_path / "root")
    nodes = NodeTasks(out=out_w)
    nodes.start(1, _echo_node(root, "@torchrun job failed: node 1, rank 3\n"), dict(os.environ))
    nodes.start(2, _echo_node(echo, "node 2 stopped because node 1 failed first\n"), dict(os.environ))
    try:
        nodes.stopped(Cause(CauseKind.RANK_FAILED, "node 1, rank 3: ValueError", node_index=1))
        open(echo, "w").close()
        assert wait_until(lambda: 2 in nodes.ended(), GUARD)
        assert _read_all(out_r) == b""
        open(root, "w").close()
        assert wait_until(lambda: 1 in nodes.ended(), GUARD)
        assert _read_all(out_r) == (b"@torchrun job failed: node 1, rank 3\n"
                                    b"node 2 stopped because node 1 failed first\n")
    finally:
        for proc in nodes.procs.values():
            if proc.poll() is None:
                proc.kill()
        nodes.wait()
        os.close(out_r)
        os.close(out_w)


def test_the_service_tells_the_verdict_before_any_node_hears_it(net):
    """So a local control holds an echo before any node can write one (node_tasks.Echoes)."""
    from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause

    told = []
    server = net.server(2, hooks=dict(on_verdict=lambda cause: told.append((cause, [c.cause for c in clients]))))
    clients = net.join(server, [0, 1])
    clients[1].report_failure(Cause(CauseKind.STEP_FAILED, "node 1 raised"))
    assert clients[0].wait_for_verdict(GUARD) is not None
    ((cause, heard),) = told
    assert cause.node_index == 1 and heard == [None, None]


def _not_running(pid: int) -> bool:
    """Gone, or a zombie: dead whatever its parent's reap."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_a_silent_nodes_processes_are_killed_frozen_and_its_forked_warm_process_too(tmp_path):
    """The gang went on without a silent node: every process of it goes, SIGSTOPped ones included (a
    SIGTERM never reaches them), the warm process forked for it from the control's too, which is not
    below its task; the task, killed, is started again as a returning node."""
    from metaflow_extensions.torchrun.plugins.torchrun.launch.command import ZYGOTE_MODULE
    from metaflow_extensions.torchrun.plugins.torchrun.runtime.node_tasks import node_processes

    warm = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # forked elsewhere, as a node's
    sock = str(tmp_path / "zygote.sock")
    (tmp_path / "zygote.sock.pid").write_text(str(warm.pid))
    stand_in = "[sys.executable, '-c', 'import time; time.sleep(60)', %r, %r]" % (ZYGOTE_MODULE, sock)
    nodes = NodeTasks(returns=1)
    nodes.start(1, _node("import subprocess, sys, time; subprocess.Popen(%s, start_new_session=True); "
                         "time.sleep(60)" % stand_in), dict(os.environ))
    first = nodes.procs[1]
    try:
        assert wait_until(lambda: len(node_processes(first.pid)) == 3, GUARD), node_processes(first.pid)
        frozen = [pid for pid, _ in node_processes(first.pid)]
        assert warm.pid in frozen and first.pid in frozen
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        nodes.cut_off(1)
        assert wait_until(lambda: all(_not_running(pid) for pid in frozen), GUARD), frozen
        assert wait_until(lambda: nodes.procs[1] is not first, GUARD)  # started again: it comes back
        assert first.returncode == -signal.SIGKILL and warm.wait(GUARD) == -signal.SIGKILL
    finally:
        nodes.stop_returns()
        for proc in list(nodes.procs.values()) + [warm]:
            if proc.poll() is None:
                proc.kill()
        nodes.wait()
