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


def _opened(handles):
    """What each handle is, checked against the sleeper's own namespaces by the test."""
    kinds = {kind: os.fstat(fd).st_ino for kind, fd in handles.items()}
    namespaces.close_handles(handles)
    return kinds


def _of(pid, kind):
    return os.stat("/proc/%d/ns/%s" % (pid, kind)).st_ino


def test_this_process_differs_from_itself_in_nothing():
    assert namespaces.to_join(os.getpid()) == ({}, None)


def test_another_network_and_host_name_are_opened_to_be_joined_where_this_process_may(unshared):
    sleeper = unshared("--net", "--uts")
    handles, why = namespaces.to_join(sleeper)
    assert why is None and _opened(handles) == {"net": _of(sleeper, "net"), "uts": _of(sleeper, "uts")}


def test_without_the_capability_to_join_it_is_refused_with_nothing_left_open(unshared, monkeypatch):
    monkeypatch.setattr(namespaces, "_effective_caps", lambda: 0)
    before = len(os.listdir("/proc/self/fd"))
    handles, why = namespaces.to_join(unshared("--net"))
    assert handles == {} and why == "another net namespace, which this process may not join"
    assert len(os.listdir("/proc/self/fd")) == before


def test_another_pid_namespace_is_refused(unshared):
    handles, why = namespaces.to_join(unshared("--pid", "--fork"))
    assert handles == {} and why == "another pid namespace"


def test_a_pid_this_process_cannot_see_is_refused():
    """SO_PEERCRED says 0 for a peer in a pid namespace this one cannot see."""
    handles, why = namespaces.to_join(0)
    assert handles == {} and why == "another pid and user namespace"
