"""The other nodes of a local run: child processes of the control task."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from typing import Any, List, Mapping, Optional, Set

from ..errors import TorchrunException
from ..gang import CONTROL_TASK_ID_ENV, LOCAL_PORT_ENV, find_free_port
from ..host import proctree
from ..launch import StepDefaults
from .warm_start import WarmStart, share_runtime_warm


def name_local_control(env: Any, task_id: Any, warm_knobs: Optional[Mapping[str, str]] = None) -> None:
    """In Metaflow's runtime, as it starts a local run's control task: the
    control task's id in that task's own environment, and, when the task runs
    on this host (``warm_knobs``: the run's knobs), the runtime's warm process
    for it to fork its own from (warm_start.py), torch imported before the
    task starts.

    Metaflow sets the id there only inside the step's code, after every
    task_pre_step: @checkpoint reads it there, and without it the control took
    an identity of its own while the other nodes took the gang's (two
    checkpoint lineages per gang). Kubernetes and Batch set it on every node
    from the start."""
    if isinstance(env, dict):
        env[CONTROL_TASK_ID_ENV] = str(task_id)
        if warm_knobs is not None:
            share_runtime_warm(env, warm_knobs)


def prepare_local_nodes(num_nodes: int, pinned_port: Optional[int], defaults: StepDefaults) -> Optional[WarmStart]:
    """On a local run's control, before Metaflow starts the other nodes from
    this process (they inherit its environment): their Python is checked now,
    so the step fails at once rather than at start_timeout; they are given
    the gang's port unless the step pinned one; and the control's warm process
    starts now, for theirs to be forked from it (the session closes it)."""
    warm = None
    if num_nodes > 1:
        problem = worker_python_problem(os.environ.get("PATH", os.defpath), sys.executable)
        if problem:
            raise TorchrunException(problem)
        warm = WarmStart.started_for_step(defaults)
        warm.share_with_local_nodes()
    if pinned_port is None:
        os.environ[LOCAL_PORT_ENV] = str(find_free_port())
    return warm


def stop_local_nodes(settle: float = 10.0, grace: float = 3.0) -> "threading.Thread":
    """Give this task's node subprocesses ``settle`` seconds to finish on their own
    (the gang has told them to stop, and they are writing their record and
    their cards: 3 s cut a worker's card off under CI's load), then SIGTERM
    them (each stops its own torchrun), then SIGKILL what is left.

    Metaflow's local control task only waits for them when its own step
    succeeds: without this, a failed control would leave them running. The
    wait runs beside the control's own end (its record, its card, Metaflow's
    bookkeeping of the failed task), not before it: the caller joins the
    thread returned as the task finishes."""
    nodes = {
        proc
        for proc, cmdline in proctree.children(os.getpid())
        if "step" in cmdline and "ubf_task" in cmdline
    }
    thread = threading.Thread(target=_stop, args=(nodes, settle, grace), name="torchrun-local-nodes")
    thread.start()
    return thread


def _stop(nodes: Set[proctree.ProcId], settle: float, grace: float) -> None:
    nodes = proctree.wait_gone(nodes, settle)
    if not nodes:
        return
    proctree.signal_all(nodes, signal.SIGTERM)
    left = proctree.wait_gone(nodes, grace)
    proctree.signal_all(left, signal.SIGKILL)
    proctree.wait_gone(left, 2)


# What a local node needs to import: Metaflow starts it as `python <flow> step ...`.
_WORKER_PROBE = "import metaflow, metaflow_extensions.torchrun.plugins.torchrun"


def worker_python_problem(path: str, this_python: str, timeout: float = 30.0) -> Optional[str]:
    """Why the other local nodes would die before joining, or None.

    Metaflow starts them with ``python`` from PATH, not with this task's
    interpreter: with the venv not activated that is another Python, without
    Metaflow, and each node dies at once while the control waits for it until
    start_timeout. Probed only when PATH's ``python`` is another interpreter."""
    found = shutil.which("python", path=path)
    if found is None:
        return _worker_message("there is no `python` on PATH", [], this_python)
    if os.path.realpath(found) == os.path.realpath(this_python) or _same_prefix(found, this_python):
        return None
    try:
        probe = subprocess.run(
            [found, "-c", _WORKER_PROBE], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return _worker_message("`%s` could not be run (%s)" % (found, e), [], this_python)
    if probe.returncode == 0:
        return None
    lines = probe.stderr.decode(errors="replace").strip().splitlines()[-5:]
    return _worker_message("`python` on PATH is %s, which cannot import Metaflow and @torchrun" % found,
                           lines, this_python)


def _same_prefix(found: str, this_python: str) -> bool:
    """The same venv's bin/ (python and python3.11 are links into it)."""
    return os.path.dirname(os.path.abspath(found)) == os.path.dirname(os.path.abspath(this_python))


def _worker_message(what: str, lines: List[str], this_python: str) -> str:
    bin_dir = os.path.dirname(this_python)
    activate = os.path.join(bin_dir, "activate")
    tail = "".join("\n    %s" % line for line in lines)
    return (
        "@torchrun: the other local nodes cannot start: Metaflow starts them with `python` from PATH, "
        "and %s.%s\nFix: activate the environment this flow runs in (`source %s`), or put its bin first "
        "on PATH (`export PATH=%s:$PATH`), then run the flow again." % (what, (" Its error:" + tail) if tail else "",
                                                                      activate, bin_dir)
    )
