"""Every port the gang uses, chosen in one place: the control's main port, where
the gang service listens, and torchrun's rendezvous ports, picked free per call."""

from __future__ import annotations

import hashlib
import random
import socket
from typing import Mapping, Optional, Tuple

from ..errors import TorchrunInvalidArgument

CANDIDATE_PORTS = 8  # with no port given, tried in order, derived from the gang id

# Below Linux's default ephemeral range (32768+), so an outgoing connection made
# between choosing a port and binding it cannot take it from us.
PORT_RANGE = (20000, 32767)


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
        raise TorchrunInvalidArgument("%s=%r is not a port number." % (source, value)) from None
    if not 0 < port < 65536:
        raise TorchrunInvalidArgument("%s=%r is outside the valid port range 1-65535." % (source, value))
    return port


def hashed_port(key: str) -> int:
    """Every node computes the same one without talking; two gangs sharing a host rarely collide."""
    digest = int(hashlib.sha256(key.encode()).hexdigest(), 16)
    low, high = PORT_RANGE
    return low + digest % (high - low + 1)


def choose_ports(env: Mapping[str, str], gang_key: str, configured: Optional[int] = None) -> Tuple[int, ...]:
    """``configured`` (``port``, ``METAFLOW_TORCHRUN_PORT``), ``MF_MASTER_PORT``, else hashed from the gang id."""
    if configured is not None:
        return (configured,)
    k8s = parse_port(env.get("MF_MASTER_PORT"), "MF_MASTER_PORT")
    if k8s is not None:
        return (k8s,)
    hashed = dict.fromkeys(hashed_port("%s#%d" % (gang_key, i)) for i in range(CANDIDATE_PORTS * 4))
    return tuple(hashed)[:CANDIDATE_PORTS]


def own_command_port(gang_key: str) -> int:
    """``current.torch.torchrun_args``' rendezvous port: every node computes it without asking the control."""
    return hashed_port("%s#own-torchrun" % gang_key)


def find_free_port(host: str = "127.0.0.1", attempts: int = 200) -> int:
    """Random in ``PORT_RANGE``: on local runs many gangs share one host."""
    rng = random.Random()
    low, high = PORT_RANGE
    for _ in range(attempts):
        port = rng.randint(low, high)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError("no free port found in %d-%d on %s" % (low, high, host))
