"""Who this node is in the gang, and where the gang meets.

Metaflow already resolves the control task's address and this task's index into
``current.parallel`` on every platform (local, Kubernetes JobSet, AWS Batch).
What it does not give is a port everyone agrees on; the rules for choosing one
live here, as pure functions of the environment where possible.
"""

from __future__ import annotations

import hashlib
import random
import socket
from dataclasses import dataclass
from typing import Mapping, Optional

from .errors import TorchrunInvalidArgument

# Exported by the local control task before Metaflow spawns the other nodes, which
# inherit it: that is how all local nodes learn one freshly chosen free port.
LOCAL_PORT_ENV = "METAFLOW_TORCHRUN_RDZV_PORT"
LOCAL_GANG_PORT_ENV = "METAFLOW_TORCHRUN_GANG_PORT"

# Below Linux's default ephemeral range (32768+), so an outgoing connection made
# between choosing a port and binding it cannot take it from us.
PORT_RANGE = (20000, 32767)


@dataclass(frozen=True)
class Topology:
    num_nodes: int
    node_index: int
    main_addr: str
    port: int  # torchrun's c10d rendezvous, hosted by the control's agent
    gang_port: int  # the gang liveness service, hosted by the control task
    is_local: bool

    @property
    def is_control(self) -> bool:
        return self.node_index == 0


def is_local_runtime(env: Mapping[str, str]) -> bool:
    return env.get("METAFLOW_RUNTIME_ENVIRONMENT", "local") == "local"


def parse_port(value: object, source: str) -> Optional[int]:
    """A port from configuration; Metaflow writes the string "None" for no port."""
    if value is None:
        return None
    text = str(value).strip()
    if text == "" or text.lower() == "none":
        return None
    try:
        port = int(text)
    except ValueError:
        raise TorchrunInvalidArgument(
            "%s=%r is not a port number." % (source, value)
        ) from None
    if not 0 < port < 65536:
        raise TorchrunInvalidArgument(
            "%s=%r is outside the valid port range 1-65535." % (source, value)
        )
    return port


def hashed_port(key: str) -> int:
    """A port derived from the gang's id: every node computes the same one without
    talking, and two gangs sharing a host (host networking) rarely collide."""
    digest = int(hashlib.sha256(key.encode()).hexdigest(), 16)
    low, high = PORT_RANGE
    return low + digest % (high - low + 1)


def choose_port(
    env: Mapping[str, str],
    gang_key: str,
    configured: Optional[int] = None,
) -> int:
    """The rendezvous port, by precedence: the decorator's ``port``; the port the
    local control task chose; ``MF_MASTER_PORT`` (``@kubernetes(port=...)``); a
    port hashed from the gang id."""
    if configured is not None:
        return configured
    local = parse_port(env.get(LOCAL_PORT_ENV), LOCAL_PORT_ENV)
    if local is not None:
        return local
    k8s = parse_port(env.get("MF_MASTER_PORT"), "MF_MASTER_PORT")
    if k8s is not None:
        return k8s
    return hashed_port(gang_key)


def choose_gang_port(env: Mapping[str, str], rdzv_port: int) -> int:
    """The liveness service listens next to the rendezvous: the port after it,
    unless the local control task chose a free one for it."""
    local = parse_port(env.get(LOCAL_GANG_PORT_ENV), LOCAL_GANG_PORT_ENV)
    if local is not None:
        return local
    return rdzv_port + 1 if rdzv_port < 65535 else rdzv_port - 1


def find_free_port(host: str = "127.0.0.1", attempts: int = 200, avoid: tuple = ()) -> int:
    """A port nobody on this host listens on right now, for local runs where many
    gangs (concurrent runs, CI) share one host."""
    rng = random.Random()
    low, high = PORT_RANGE
    for _ in range(attempts):
        port = rng.randint(low, high)
        if port in avoid:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError("no free port found in %d-%d on %s" % (low, high, host))


def topology_from(
    parallel: object, env: Mapping[str, str], gang_key: str, port: Optional[int] = None
) -> Topology:
    """Build from Metaflow's ``current.parallel`` (main_ip, num_nodes, node_index)."""
    num_nodes = int(getattr(parallel, "num_nodes"))
    node_index = int(getattr(parallel, "node_index"))
    main_addr = str(getattr(parallel, "main_ip"))
    if num_nodes < 1 or not 0 <= node_index < num_nodes:
        raise TorchrunInvalidArgument(
            "inconsistent @parallel topology: node %d of %d." % (node_index, num_nodes)
        )
    rdzv_port = choose_port(env, gang_key, port)
    return Topology(
        num_nodes=num_nodes,
        node_index=node_index,
        main_addr=main_addr,
        port=rdzv_port,
        gang_port=choose_gang_port(env, rdzv_port),
        is_local=is_local_runtime(env),
    )
