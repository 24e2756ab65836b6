"""proctree.py against real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap

import pytest
from proc_helpers import (
    PY,
    SLEEPER_WRITING_PID,
    is_running,
    read_pid_file,
    start_time,
    wait_until,
)

from metaflow_extensions.torchrun.plugins.torchrun.host import proctree

# A child that starts the SLEEPER grandchild (in a new session when asked) and sleeps.
PARENT_OF_SLEEPER = textwrap.dedent(
    """
    import subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                     start_new_session=sys.argv[3] == "1")
    time.sleep(60)
    """
)


def _tree(procs, tmp_path, new_session=False):
    pidfile = str(tmp_path / "grandchild.pid")
    child = procs.popen(
        [PY, "-c", PARENT_OF_SLEEPER, SLEEPER_WRITING_PID, pidfile, "1" if new_session else "0"]
    )
    grandchild = procs.add(read_pid_file(pidfile))
    return child, grandchild


class TestProcessId:
    def test_self(self):
        pid, start = proctree.process_id(os.getpid())
        assert pid == os.getpid() and start == start_time(os.getpid()) and start > 0

    def test_dead_and_reaped(self, procs):
        p = procs.popen([PY, "-c", "pass"])
        p.wait()
        assert proctree.process_id(p.pid) is None

    def test_zombie_counts_as_dead(self, procs):
        p = procs.popen([PY, "-c", "pass"])
        # do not reap: the child stays a zombie until waited for
        assert wait_until(lambda: open("/proc/%d/stat" % p.pid).read().split(")")[-1].split()[0] == "Z")
        assert proctree.process_id(p.pid) is None
        p.wait()

    def test_never_existed(self):
        assert proctree.process_id(2**22 + 12345) is None

    def test_command_name_with_spaces_and_parens(self, procs, tmp_path):
        # /proc/<pid>/stat holds the name in parentheses; a ') (' inside must not
        # shift the fields (the parent pid and start time would be wrong).
        ready = str(tmp_path / "ready")
        code = textwrap.dedent(
            """
            import ctypes, sys, time
            ctypes.CDLL(None).prctl(15, b"x) (y z) 1 2", 0, 0, 0)  # PR_SET_NAME
            open(sys.argv[1], "w").close()
            time.sleep(60)
            """
        )
        p = procs.popen([PY, "-c", code, ready])
        assert wait_until(lambda: os.path.exists(ready))
        with open("/proc/%d/comm" % p.pid) as f:
            assert ")" in f.read()
        assert proctree.process_id(p.pid) == (p.pid, start_time(p.pid))
        assert (p.pid, start_time(p.pid)) in proctree.descendants(os.getpid())
        assert proctree._stat(p.pid)[0] == os.getpid()


class TestDescendants:
    @pytest.mark.parametrize("new_session", [False, True])
    def test_finds_grandchildren(self, procs, tmp_path, new_session):
        child, grandchild = _tree(procs, tmp_path, new_session)
        below_child = proctree.descendants(child.pid)
        assert (grandchild, start_time(grandchild)) in below_child
        assert all(pid != child.pid for pid, _ in below_child)  # not the root itself
        below_me = {pid for pid, _ in proctree.descendants(os.getpid())}
        assert {child.pid, grandchild} <= below_me

    def test_leaf_has_none(self, procs, tmp_path):
        _, grandchild = _tree(procs, tmp_path)
        assert proctree.descendants(grandchild) == set()

    def test_children_with_command_lines(self, procs, tmp_path):
        child, grandchild = _tree(procs, tmp_path)
        found = dict(proctree.children(child.pid))
        assert list(found) == [(grandchild, start_time(grandchild))]
        argv = found[(grandchild, start_time(grandchild))]
        assert argv[0] == PY and argv[1] == "-c" and str(tmp_path / "grandchild.pid") in argv
        # only direct children
        assert grandchild not in {pid for (pid, _), _ in proctree.children(os.getpid())}


class TestSignalling:
    def test_wrong_start_time_is_never_signalled(self, procs):
        p = procs.popen([PY, "-c", "import time; time.sleep(60)"])
        assert wait_until(lambda: start_time(p.pid) is not None)
        real = start_time(p.pid)
        proctree.signal_all([(p.pid, real + 1), (p.pid, real - 1)], signal.SIGKILL)
        # a signal is delivered asynchronously: give a wrongly sent one time to land
        assert not wait_until(lambda: not is_running(p.pid), timeout=0.3)
        assert p.poll() is None
        assert proctree.alive([(p.pid, real + 1)]) == set()
        assert proctree.alive([(p.pid, real)]) == {(p.pid, real)}
        # the right identity is signalled
        proctree.signal_all([(p.pid, real)], signal.SIGKILL)
        assert p.wait(timeout=5) == -signal.SIGKILL

    def _group(self, procs, tmp_path, name):
        """A session leader (like torchrun's workers) with a child in its group."""
        leader = procs.popen(
            [PY, "-c", PARENT_OF_SLEEPER, SLEEPER_WRITING_PID, str(tmp_path / name), "0"],
            start_new_session=True,
        )
        member = procs.add(read_pid_file(str(tmp_path / name)))
        assert os.getpgid(member) == leader.pid == os.getpgid(leader.pid)
        return leader, member

    def test_group_leader_takes_its_group_with_it(self, procs, tmp_path):
        leader, member = self._group(procs, tmp_path, "g.pid")
        proctree.signal_all([proctree.process_id(leader.pid)], signal.SIGKILL)
        assert leader.wait(timeout=5) == -signal.SIGKILL
        assert wait_until(lambda: not is_running(member)), "group member survived"

    def test_a_group_member_is_signalled_alone(self, procs, tmp_path):
        leader, member = self._group(procs, tmp_path, "g.pid")
        proctree.signal_all([proctree.process_id(member)], signal.SIGKILL)
        assert wait_until(lambda: not is_running(member))
        assert not wait_until(lambda: leader.poll() is not None, timeout=0.3), "leader was hit"

    def test_already_dead_is_fine(self, procs):
        p = procs.popen([PY, "-c", "pass"])
        ident = (p.pid, start_time(p.pid) or 0)
        p.wait()
        proctree.signal_all([ident], signal.SIGKILL)  # no error

    def test_wait_gone(self, procs):
        p = procs.popen([PY, "-c", "import time; time.sleep(60)"])
        assert wait_until(lambda: start_time(p.pid) is not None)
        ident = proctree.process_id(p.pid)
        assert proctree.wait_gone([ident], timeout=0.2) == {ident}
        p.kill()
        p.wait()
        assert proctree.wait_gone([ident], timeout=2) == set()


# A child whose main thread blocks the signal while another thread does not;
# faulthandler prints the stack of whichever thread the signal lands on.
MAIN_BLOCKS = textwrap.dedent(
    """
    import faulthandler, os, signal, sys, threading, time
    sig = int(sys.argv[1])
    faulthandler.register(sig, file=sys.stdout, all_threads=False)
    def other_thread():
        while True:
            time.sleep(0.01)
    threading.Thread(target=other_thread, daemon=True).start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
    os.write(1, b"ready\\n")
    time.sleep(float(sys.argv[2]))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})  # one pending on this thread lands now
    time.sleep(60)
    """
)


def _dumped_stack(p) -> str:
    lines = []
    while True:
        line = p.stdout.readline().decode()
        assert line, "the child exited"
        lines.append(line)
        if "in <module>" in line or "in other_thread" in line:  # the thread's outermost frame
            return "".join(lines)


class TestSignalMainThread:
    """stacks.collect signals a rank's main thread: faulthandler's dump run on a
    torch thread while the main thread runs on can crash the rank."""

    def _start(self, procs, hold):
        sig = signal.SIGRTMIN + 3
        p = procs.popen([PY, "-u", "-c", MAIN_BLOCKS, str(int(sig)), str(hold)], stdout=subprocess.PIPE)
        assert p.stdout.readline() == b"ready\n"
        return p, sig

    def test_it_lands_on_the_main_thread_even_where_another_thread_would_take_it(self, procs):
        p, sig = self._start(procs, hold=1.0)
        proctree.signal_main_thread(p.pid, sig)
        stack = _dumped_stack(p)  # pending on the main thread until it unblocks it
        assert "in <module>" in stack and "other_thread" not in stack, stack

    def test_a_signal_to_the_process_lands_on_the_other_thread(self, procs):
        """What the test above rules out: os.kill's signal goes to a thread that takes it."""
        p, sig = self._start(procs, hold=30.0)
        os.kill(p.pid, sig)
        stack = _dumped_stack(p)
        assert "in other_thread" in stack, stack

    def test_a_process_gone_raises_as_os_kill_does(self, procs):
        p = procs.popen([PY, "-c", "pass"])
        p.wait()
        with pytest.raises(OSError):
            proctree.signal_main_thread(p.pid, signal.SIGRTMIN + 3)


class TestDieWithParent:
    def test_returns_true_on_linux(self):
        code = (
            "from metaflow_extensions.torchrun.plugins.torchrun.host import proctree; "
            "print(proctree.die_with_parent())"
        )
        out = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == "True", out.stderr

    def test_child_dies_when_its_parent_is_killed(self, procs, tmp_path):
        pidfile = str(tmp_path / "child.pid")
        child_code = textwrap.dedent(
            """
            import os, sys, time
            from metaflow_extensions.torchrun.plugins.torchrun.host import proctree
            ok = proctree.die_with_parent()
            with open(sys.argv[1] + ".tmp", "w") as f:
                f.write("%d %s" % (os.getpid(), ok))
            os.replace(sys.argv[1] + ".tmp", sys.argv[1])
            time.sleep(60)
            """
        )
        parent_code = textwrap.dedent(
            """
            import subprocess, sys, time
            subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
            time.sleep(60)
            """
        )
        parent = procs.popen([PY, "-c", parent_code, child_code, pidfile])
        child = procs.add(read_pid_file(pidfile))
        with open(pidfile) as f:
            assert f.read().split()[1] == "True"
        assert is_running(child)
        parent.kill()
        parent.wait()
        assert wait_until(lambda: not is_running(child), timeout=5), "child outlived its parent"

    def test_without_it_the_child_survives(self, procs, tmp_path):
        # the control for the test above: the death really comes from die_with_parent
        pidfile = str(tmp_path / "child.pid")
        parent_code = textwrap.dedent(
            """
            import subprocess, sys, time
            subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
            time.sleep(60)
            """
        )
        parent = procs.popen([PY, "-c", parent_code, SLEEPER_WRITING_PID, pidfile])
        child = procs.add(read_pid_file(pidfile))
        parent.kill()
        parent.wait()
        assert not wait_until(lambda: not is_running(child), timeout=0.5)
