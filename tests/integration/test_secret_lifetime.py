"""Issue 29: the per-attempt gang secret the control stores in the run's
datastore is removed when the control's step ends, on every path: success, a
failed rank, Ctrl-C. Real 2-node x 2-process local runs."""

import os
import signal

import pytest


pytestmark = pytest.mark.integration


def secret_files(gang):
    found = []
    for root, _dirs, names in os.walk(os.path.join(gang.tmp, ".metaflow")):
        found += [os.path.join(root, n) for n in names if n.startswith("torchrun-gang-secret")]
    return found


def test_removed_after_a_successful_step(calls_run):
    assert calls_run.returncode == 0, calls_run.text[-3000:]
    assert secret_files(calls_run.gang) == []


def test_removed_after_a_failed_step(failed_run):
    assert failed_run.proc.returncode != 0
    assert secret_files(failed_run.gang) == []


def test_removed_after_ctrl_c(gang):
    """Also the test that a terminal's Ctrl-C leaves no process behind (the
    gang fixture fails a test whose processes outlive it)."""
    proc = gang.start("--script", "spin.py")
    try:
        gang.wait_for_reports("ready-", 4, timeout=120)
        stored = secret_files(gang)
        assert len(stored) == 1 and stored[0].endswith("torchrun-gang-secret.0"), stored  # there while it runs
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0, out.decode(errors="replace")
    assert secret_files(gang) == []
