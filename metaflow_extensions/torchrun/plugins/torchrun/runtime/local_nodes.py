"""The other nodes of a local run: child processes of the control task."""

from __future__ import annotations

import os
import signal

from ..host import proctree


def stop_local_nodes(settle: float = 3.0, grace: float = 3.0) -> None:
    """Give this task's node subprocesses ``settle`` seconds to finish on their own
    (the gang has told them to stop, and they are reporting why), then SIGTERM
    them (each stops its own torchrun), then SIGKILL what is left.

    Metaflow's local control task only waits for them when its own step
    succeeds: without this, a failed control would leave them running."""
    nodes = {
        proc
        for proc, cmdline in proctree.children(os.getpid())
        if "step" in cmdline and "ubf_task" in cmdline
    }
    nodes = proctree.wait_gone(nodes, settle)
    if not nodes:
        return
    proctree.signal_all(nodes, signal.SIGTERM)
    left = proctree.wait_gone(nodes, grace)
    proctree.signal_all(left, signal.SIGKILL)
    proctree.wait_gone(left, 2)
