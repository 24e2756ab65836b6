"""runtime/local_nodes.py: a failed local control stops its node subprocesses
beside its own end, not before it."""

from __future__ import annotations

import subprocess
import sys
import time

from metaflow_extensions.torchrun.plugins.torchrun.runtime.local_nodes import stop_local_nodes

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
