"""Where a process lives, compared (host/namespaces.py): what a warm process's child
may join, and why it may not."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.host import namespaces

pytestmark = pytest.mark.skipif(os.getuid() != 0 or not shutil.which("unshare"),
                                reason="namespaces of its own take root and unshare(1)")


@pytest.fixture
def unshared():
    """``unshared(*flags)``: a sleeping process in new namespaces, its pid as this one sees it."""
    started = []

    def start(*flags):
        proc = subprocess.Popen(["unshare", *flags, "sleep", "60"], start_new_session=True)
        started.append(proc)
        deadline = time.monotonic() + 10
        while True:  # unshare(1) execs, or forks first (--fork): the sleeper is then its child
            pid = proc.pid
            if "--fork" in flags:
                with open("/proc/%d/task/%d/children" % (proc.pid, proc.pid)) as f:
                    kids = f.read().split()
                pid = int(kids[0]) if kids else 0
            if pid and _comm(pid) == "sleep":
                return pid
            assert time.monotonic() < deadline, "unshare never ran its sleep"
            time.sleep(0.01)

    yield start
    for proc in started:
        os.killpg(proc.pid, 9)
        proc.wait()


def _comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return ""


def test_this_process_differs_from_itself_in_nothing():
    assert namespaces.differences(os.getpid()) == ((), None)


def test_another_network_and_host_name_are_joined_where_this_process_may(unshared):
    kinds, why = namespaces.differences(unshared("--net", "--uts"))
    assert kinds == ("net", "uts") and why is None


def test_without_the_capability_to_join_it_is_refused(unshared, monkeypatch):
    monkeypatch.setattr(namespaces, "_effective_caps", lambda pid: 0)
    kinds, why = namespaces.differences(unshared("--net"))
    assert kinds == ("net",) and why == "another net namespace, which this process may not join"


def test_another_pid_namespace_is_refused(unshared):
    kinds, why = namespaces.differences(unshared("--pid", "--fork"))
    assert "pid" in kinds and why == "another pid namespace"


def test_a_pid_this_process_cannot_see_is_refused():
    """SO_PEERCRED says 0 for a peer in a pid namespace this one cannot see."""
    kinds, why = namespaces.differences(0)
    assert why is not None and why.startswith("another pid and user namespace")
