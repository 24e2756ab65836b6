"""The other nodes of a local run, started by the control task itself (Metaflow's
contract kept) so it sees a node's task end before it joined; the control ends with
the runtime, its nodes with the control: killing ``flow.py run`` leaves no task behind.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
from typing import Any, Callable, List, Mapping, Optional, Set, Tuple

from metaflow import current
from metaflow.cli_args import cli_args
from metaflow.plugins import parallel_decorator
from metaflow.unbounded_foreach import UBF_TASK

from ..cause import Cause
from ..errors import TorchrunException
from ..gang.membership import NodeEnd
from ..gang.ports import find_free_port
from ..gang.topology import Topology
from ..host import proctree
from ..base.knobs import PORT_ENV
from ..launch import StepDefaults
from ..procs.failures import describe_exit_code
from .in_runtime import RUNTIME_PID_ENV
from .node_tasks import NodeTasks
from .warm_start import WarmStart


def prepare_local_nodes(num_nodes: int, pinned_port: Optional[int],
                        defaults: StepDefaults) -> Tuple[Optional[WarmStart], int]:
    """On a local control, before its nodes start (they inherit its environment): their
    Python checked now, not at start_timeout; the gang's port (returned) in ``PORT_ENV``;
    the control's warm process started for theirs to fork from."""
    global _returns
    _end_with_runtime()
    # A node task killed may come back (as a pod is re-created) where the gang can go on without it.
    _returns = defaults.restarts if defaults.spares or defaults.min_nodes else 0
    warm = None
    if num_nodes > 1:
        problem = worker_python_problem(os.environ.get("PATH", os.defpath), sys.executable)
        if problem:
            raise TorchrunException(problem)
        warm = WarmStart.started_for_step(defaults)
        warm.share_with_local_nodes()
    port = pinned_port if pinned_port is not None else find_free_port()
    if pinned_port is None:
        os.environ[PORT_ENV] = str(port)
    return warm, port


# The node tasks this control started.
_started: Optional[NodeTasks] = None
_runtime_pid: Optional[int] = None
_returns = 0  # times a node's task killed is started again


def own_start(decorated: Callable[[], Any]) -> Callable[[], Any]:
    """Metaflow's local control step with the nodes started by ``run_local_control``;
    unchanged where it is not the function this was written against."""
    if (isinstance(decorated, functools.partial) and not decorated.keywords and len(decorated.args) == 5
            and decorated.func is getattr(parallel_decorator, "_local_multinode_control_task_step_func", None)):
        return functools.partial(run_local_control, *decorated.args)
    return decorated


def run_local_control(flow: Any, env_to_use: Any, step_func: Callable[[], Any], retry_count: int,
                      input_paths: str) -> None:
    """What Metaflow's local control does, each node's task held by the control."""
    global _started
    num_nodes = int(flow._parallel_ubf_iter.num_parallel)
    os.environ.update({"MF_PARALLEL_NUM_NODES": str(num_nodes), "MF_PARALLEL_MAIN_IP": "127.0.0.1",
                       "MF_PARALLEL_CONTROL_TASK_ID": str(current.task_id)})
    executable, step_name = env_to_use.executable(current.step_name), current.step_name
    task_ids = [str(current.task_id)] + ["%s_node_%d" % (current.task_id, n) for n in range(1, num_nodes)]
    nodes = _started = NodeTasks(_returns)
    for node in range(1, num_nodes):
        kwargs = dict(cli_args.step_kwargs, split_index=str(node), run_id=current.run_id, task_id=task_ids[node],
                      input_paths=input_paths, ubf_context=UBF_TASK, retry_count=str(retry_count))
        argv = cli_args.step_command(executable, sys.argv[0], step_name, step_kwargs=kwargs)
        nodes.start(node, argv, dict(os.environ, MF_PARALLEL_NODE_INDEX=str(node)))
    flow._control_mapper_tasks = ["%s/%s/%s" % (current.run_id, step_name, t) for t in task_ids]
    os.environ["MF_PARALLEL_NODE_INDEX"] = "0"
    step_func()
    codes = nodes.wait()
    nodes.release()  # the step went on: its nodes' lines held for the control's error follow now
    failed = {node: code for node, code in codes.items() if code}
    if failed:
        node = min(failed)
        raise TorchrunException("node %d's task failed (%s)" % (node, describe_exit_code(failed[node])))


def local_node_ends(topology: Topology) -> Optional[Callable[[], Mapping[int, NodeEnd]]]:
    """For the gang service of a local control that started its nodes: which of their tasks have ended
    (one that ends unjoined ends the gang); None elsewhere."""
    if _started is not None and topology.is_local and topology.num_nodes > 1:
        return _started.ended
    return None


def local_node_verdict(topology: Topology) -> Optional[Callable[[Cause], None]]:
    """For the gang service of a local control that started its nodes: told the gang's verdict before
    any node is, so the node tasks' lines pass on the root cause's first (node_tasks.Echoes); None elsewhere."""
    if _started is not None and topology.is_local and topology.num_nodes > 1:
        return _started.stopped
    return None


def local_node_cut_off(topology: Topology) -> Optional[Callable[[int], None]]:
    """For the gang service of a local control that started its nodes: told a silent node the gang went on
    without, so that node's processes are killed here, where they run (node_tasks.NodeTasks.cut_off)."""
    if _started is not None and topology.is_local and topology.num_nodes > 1:
        return _started.cut_off
    return None


def runtime_gone() -> bool:
    """Whether the runtime that started this control has gone: nobody waits for what it says."""
    return _runtime_pid is not None and proctree.process_id(_runtime_pid) is None  # gone, or a zombie


def _end_with_runtime() -> None:
    """SIGTERM to this task when the runtime dies (in a call, the gang stops with
    its grace); now if it went before we asked."""
    global _runtime_pid
    try:
        _runtime_pid = int(os.environ.get(RUNTIME_PID_ENV, ""))
    except ValueError:
        return
    proctree.die_with_parent(signal.SIGTERM)
    if runtime_gone():
        os.kill(os.getpid(), signal.SIGTERM)


def stop_local_nodes(missing_nodes: Optional[Callable[[], List[int]]] = None, settle: float = 10.0,
                     grace: float = 3.0) -> threading.Thread:
    """A failed control's nodes (Metaflow waits for them only on success): ``settle``
    seconds to write their record and cards (3 s cut a card off under CI's load), then
    SIGTERM, then SIGKILL; SIGTERM at once for those never joined (``missing_nodes``: the
    gang's word; without it, all), or all with the runtime gone. In a thread the caller
    joins as the task finishes."""
    at_once: Set[proctree.ProcId] = set()
    if _started is not None:
        _started.stop_returns()
        running = _started.running()
        missing = set(missing_nodes()) if missing_nodes is not None else set(running)
        at_once = {pid for node, pid in running.items() if node in missing or runtime_gone()}
        nodes = set(running.values()) - at_once
    else:
        children = proctree.children(os.getpid())
        nodes = {proc for proc, cmdline in children if "step" in cmdline and "ubf_task" in cmdline}
    thread = threading.Thread(target=_stop, args=(nodes, at_once, settle, grace, _started),
                              name="torchrun-local-nodes")
    thread.start()
    return thread


def _stop(nodes: Set[proctree.ProcId], at_once: Set[proctree.ProcId], settle: float, grace: float,
          started: Optional[NodeTasks]) -> None:
    proctree.signal_all(at_once, signal.SIGTERM)
    nodes = proctree.wait_gone(nodes, settle)
    proctree.signal_all(nodes, signal.SIGTERM)
    left = proctree.wait_gone(nodes | at_once, grace)
    proctree.signal_all(left, signal.SIGKILL)
    proctree.wait_gone(left, 2)
    if started is not None:
        started.drain()  # their last lines (`node 1 stopped because ...`) before the control ends


# What a local node needs to import: Metaflow starts it as `python <flow> step ...`.
_WORKER_PROBE = "import metaflow, metaflow_extensions.torchrun.plugins.torchrun"


def worker_python_problem(path: str, this_python: str, timeout: float = 30.0) -> Optional[str]:
    """Why the other local nodes would die before joining, or None: Metaflow starts them
    with PATH's ``python``, asked here unless it is in this task's own ``bin``."""
    found = shutil.which("python", path=path)
    if found is None:
        return _worker_message("there is no `python` on PATH", [], this_python)
    # The same venv's bin/ (where a Python finds its pyvenv.cfg, so links are not followed).
    if os.path.dirname(os.path.abspath(found)) == os.path.dirname(os.path.abspath(this_python)):
        return None
    try:
        probe = subprocess.run([found, "-c", _WORKER_PROBE], capture_output=True, timeout=timeout,
                               stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return _worker_message("`%s` could not be run (%s)" % (found, e), [], this_python)
    if probe.returncode == 0:
        return None
    lines = probe.stderr.decode(errors="replace").strip().splitlines()[-5:]
    return _worker_message("`python` on PATH is %s, which cannot import Metaflow and @torchrun" % found,
                           lines, this_python)


def _worker_message(what: str, lines: List[str], this_python: str) -> str:
    bin_dir = os.path.dirname(this_python)
    tail = "".join("\n    %s" % line for line in lines)
    return ("@torchrun: the other local nodes cannot start: Metaflow starts them with `python` from PATH, "
            "and %s.%s\nFix: activate the environment this flow runs in (`source %s`), or put its bin first "
            "on PATH (`export PATH=%s:$PATH`), then run the flow again."
            % (what, (" Its error:" + tail) if tail else "", os.path.join(bin_dir, "activate"), bin_dir))
