"""Pure: a planned call made concrete on this node (torchrun's argv and the ranks' environment) from
three typed records, never loose keywords: a setting added to the step reaches the ranks here or nowhere
(``tests/unit/test_prepare.py`` checks each one at a value other than its default)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, NamedTuple, Optional

from ..procs import names
from .command import Launch, build_command
from .plan import CallPlan, StepDefaults


@dataclass(frozen=True)
class NodeFacts:
    """What only the running node knows when its call starts."""

    python: str
    node_index: int  # Metaflow's (the step's task)
    num_nodes: int  # that train: the step's, less its spares (@torchrun(spares))
    main_addr: str  # where the rendezvous is (the control)
    local_addr: str  # where the other nodes reach this one
    iface: Optional[str]  # the interface of local_addr
    rdzv_port: int
    rdzv_id: str
    workdir: str  # the call's private work directory
    log_dir: Optional[str]  # the ranks' log files
    entry_path: str  # what the ranks run (procs/entry.py)
    flow_dir: Optional[str]
    node_rank: Optional[int] = None  # torchrun's: node_index less the benched nodes before it (gang/bench.py)


class NodeStart(NamedTuple):
    """This node's torchrun, and the rendezvous endpoint its argv names (the caller waits on it, not on argv)."""

    argv: List[str]
    env: Dict[str, str]
    rdzv_endpoint: str


def prepare_launch(plan: CallPlan, defaults: StepDefaults, node: NodeFacts, base: Mapping[str, str]) -> NodeStart:
    launch = Launch(python=node.python, num_nodes=node.num_nodes, nproc_per_node=plan.nproc,
                    node_index=node.node_index if node.node_rank is None else node.node_rank,
                    rdzv_host=node.main_addr, rdzv_port=node.rdzv_port, rdzv_id=node.rdzv_id,
                    entrypoint=node.entry_path, user_options=plan.options, local_addr=node.local_addr,
                    start_timeout=defaults.start_timeout)
    return NodeStart(build_command(launch), rank_environment(base, defaults, plan, node), launch.rdzv_endpoint)


def rank_environment(base: Mapping[str, str], defaults: StepDefaults, plan: CallPlan,
                     node: NodeFacts) -> Dict[str, str]:
    """The environment of this node's torchrun and its ranks."""
    env = dict(base)
    # torchrun's agent passes SIGTERM on to the ranks and waits this long before SIGKILL (an int).
    env[names.SHUTDOWN_TIMEOUT_ENV] = str(int(math.ceil(defaults.shutdown_grace)))
    if plan.function is not None and node.flow_dir:
        # Ranks import the function's module as the flow file would: from the flow's directory.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (node.flow_dir, env.get("PYTHONPATH")) if p)
    env[names.WORK_DIR_ENV] = node.workdir
    # The agent's own directories go with the work directory (procs/entry.py gives the ranks the user's TMPDIR).
    env[names.USER_TMPDIR_ENV] = base.get("TMPDIR", "")
    env["TMPDIR"] = os.path.join(node.workdir, names.AGENT_TMP)
    env[names.ENTRY_ENV] = node.entry_path
    env[names.NODE_INDEX_ENV] = str(node.node_index)
    if node.iface and "GLOO_SOCKET_IFNAME" not in env:
        # Else gloo binds to what the host name resolves to, often unreachable (127.0.1.1, containers).
        env["GLOO_SOCKET_IFNAME"] = node.iface
    if plan.torch_restarts:
        # A store shared with the agent outlives a round: restarted workers read the last round's addresses
        # (gloo: "Connection refused"). Sharing off, rank 0 hosts a fresh one per round, 0.5 s slower to start.
        env.setdefault(names.SHARE_STORE_OFF_ENV, "1")
    env[names.LABELS_ENV] = "1" if defaults.label_logs else "0"
    if node.log_dir:
        env[names.LOG_DIR_ENV] = node.log_dir
    if names.FR_BUFFER_ENV not in env and names.FR_BUFFER_OLD_ENV not in env:
        # torch's Flight Recorder, read when a hang is stopped (procs/flight_ask.py); the user's setting stands.
        env[names.FR_BUFFER_ENV] = str(defaults.knobs.flight_recorder)
    return env
