"""``@torchrun``: Metaflow hooks only. The work happens in ``runner.py``."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Dict

from metaflow.plugins.parallel_decorator import ParallelDecorator
from metaflow.unbounded_foreach import UBF_CONTROL

from . import proctree
from .errors import TorchrunInvalidArgument
from .runner import GangIdentity, StepDefaults, TorchrunHandle, validate_nproc
from .topology import LOCAL_PORT_ENV, find_free_port, is_local_runtime, parse_port


class TorchrunDecorator(ParallelDecorator):
    """
    Run a PyTorch distributed program with ``torchrun`` on every node of a
    ``@parallel`` step: ``current.torch.run(entrypoint="train.py", ...)``.

    Parameters
    ----------
    nproc_per_node : int, optional
        Processes per node; overrides what is derived from the step's resources.
    torchrun_args : dict or list, optional
        Extra torchrun options, e.g. ``{"max_restarts": 2}``.
    port : int, optional
        Rendezvous port on the control node (default: chosen automatically).
    """

    name = "torchrun"
    defaults: Dict[str, Any] = {
        "nproc_per_node": None,
        "torchrun_args": None,
        "port": None,
    }
    IS_PARALLEL = True

    def step_init(
        self, flow, graph, step_name, decorators, environment, flow_datastore, logger
    ):
        super().step_init(
            flow, graph, step_name, decorators, environment, flow_datastore, logger
        )
        nproc = self.attributes.get("nproc_per_node")
        if nproc is not None:
            validate_nproc(nproc, "@torchrun(nproc_per_node)")
        self._port = parse_port(self.attributes.get("port"), "@torchrun(port)")
        self._flow_name = flow.name
        self._flow_dir = os.path.dirname(os.path.abspath(sys.argv[0]))

    def task_pre_step(
        self,
        step_name,
        task_datastore,
        metadata,
        run_id,
        task_id,
        flow,
        graph,
        retry_count,
        max_user_code_retries,
        ubf_context,
        inputs,
    ):
        super().task_pre_step(
            step_name,
            task_datastore,
            metadata,
            run_id,
            task_id,
            flow,
            graph,
            retry_count,
            max_user_code_retries,
            ubf_context,
            inputs,
        )
        from metaflow import current

        if ubf_context == UBF_CONTROL and is_local_runtime(os.environ):
            # Metaflow spawns the other local nodes from this process after this
            # hook: they inherit the port through the environment.
            if self._port is None:
                os.environ[LOCAL_PORT_ENV] = str(find_free_port())
        control_task_id = os.environ.get("MF_PARALLEL_CONTROL_TASK_ID") or (
            task_id if ubf_context == UBF_CONTROL else None
        )
        identity = GangIdentity(
            flow_name=self._flow_name,
            run_id=str(run_id),
            step_name=step_name,
            control_task_id=str(control_task_id or _control_id_from(task_id)),
            attempt=int(retry_count),
        )
        defaults = StepDefaults(
            nproc_per_node=self.attributes.get("nproc_per_node"),
            torchrun_args=self.attributes.get("torchrun_args"),
            port=self._port,
        )
        current._update_env(
            {
                "torch": TorchrunHandle(
                    identity, defaults, lambda: current.parallel, self._flow_dir
                )
            }
        )

    def task_decorate(
        self, step_func, flow, graph, retry_count, max_user_code_retries, ubf_context
    ):
        decorated = super().task_decorate(
            step_func, flow, graph, retry_count, max_user_code_retries, ubf_context
        )
        if not (ubf_context == UBF_CONTROL and is_local_runtime(os.environ)):
            return decorated

        def control_step():
            # Metaflow's local control task starts the other nodes as child
            # processes and only waits for them when its own step succeeds: if it
            # fails, we stop them so no node outlives the step.
            try:
                return decorated()
            except BaseException:
                _stop_local_nodes()
                raise

        return control_step


def _control_id_from(task_id: str) -> str:
    # Local worker task ids are "<control id>_node_<index>".
    return str(task_id).split("_node_")[0]


def _stop_local_nodes(grace: float = 4.0) -> None:
    """SIGTERM this task's node subprocesses (each stops its own torchrun), then
    SIGKILL whatever has not exited after ``grace`` seconds."""
    nodes = {
        proc
        for proc, cmdline in proctree.children(os.getpid())
        if "step" in cmdline and "ubf_task" in cmdline
    }
    if not nodes:
        return
    proctree.signal_all(nodes, signal.SIGTERM)
    left = proctree.wait_gone(nodes, grace)
    proctree.signal_all(left, signal.SIGKILL)
    proctree.wait_gone(left, 2)
