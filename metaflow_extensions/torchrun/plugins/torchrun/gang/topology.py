"""Who this node is in the gang, and where the gang meets: Metaflow's
``current.parallel`` gives all but a port everyone agrees on (``ports.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

from ..errors import TorchrunInvalidArgument
from .ports import choose_ports


@dataclass(frozen=True)
class Topology:
    num_nodes: int
    node_index: int
    main_addr: str
    ports: Tuple[int, ...]
    is_local: bool
    # Whether the step can succeed after a node's task is lost: not on AWS Batch, where Metaflow's control
    # waits for every node's task and fails the step without it (docs/aws-batch.md).
    survives_loss: bool = True

    @property
    def is_control(self) -> bool:
        return self.node_index == 0


# Metaflow's name for the control task's id, on every node of a @parallel step.
CONTROL_TASK_ID_ENV = "MF_PARALLEL_CONTROL_TASK_ID"
BATCH_JOB_ENV = "AWS_BATCH_JOB_ID"  # set by AWS Batch in every container of a job


def is_local_runtime(env: Mapping[str, str]) -> bool:
    return env.get("METAFLOW_RUNTIME_ENVIRONMENT", "local") == "local"


def topology_from(parallel: object, env: Mapping[str, str], gang_key: str, port: Optional[int] = None) -> Topology:
    num_nodes = int(getattr(parallel, "num_nodes"))
    node_index = int(getattr(parallel, "node_index"))
    main_addr = str(getattr(parallel, "main_ip"))
    if num_nodes < 1 or not 0 <= node_index < num_nodes:
        raise TorchrunInvalidArgument("inconsistent @parallel topology: node %d of %d." % (node_index, num_nodes))
    return Topology(num_nodes=num_nodes, node_index=node_index, main_addr=main_addr,
                    ports=choose_ports(env, gang_key, port), is_local=is_local_runtime(env),
                    survives_loss=not env.get(BATCH_JOB_ENV))
