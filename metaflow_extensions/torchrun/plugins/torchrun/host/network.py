"""Which local address and interface this node reaches the control through: the host
name may resolve to one other nodes cannot reach (Debian's 127.0.1.1, odd /etc/hosts
in pods); the kernel's source address towards the control they can.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import os
import struct
import time
from typing import List, Optional, Tuple

from ..base.knobs import TEST_HOSTS_ENV

_SIOCGIFADDR = 0x8915


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address, bracketed IPv6 included; a name is not resolved."""
    host = host.strip().strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def local_address_towards(host: str, port: int = 9) -> Optional[str]:
    """The source address of a route to ``host`` (a UDP connect sends nothing)."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            return s.getsockname()[0]
    except (OSError, IndexError):
        return None


def host_name(node_index: int) -> str:
    """This node's host in the gang's records and the node history (tests name local "nodes": ``TEST_HOSTS_ENV``)."""
    env = os.environ
    names = env.get(TEST_HOSTS_ENV, "").split(",")
    if 0 <= node_index < len(names) and names[node_index].strip():
        return names[node_index].strip()[:255]
    if env.get("METAFLOW_KUBERNETES_NODE_IP"):
        # A pod's host name is new on every attempt: a history of failures is about the node.
        return "node " + env["METAFLOW_KUBERNETES_NODE_IP"][:200]
    return socket.gethostname()


def route_to(main_addr: str, is_local: bool) -> Tuple[str, Optional[str]]:
    """The address other nodes reach this one at, and its interface; on a cluster, not a
    loopback one (a Batch main node's 127.0.1.1): the default route's source instead."""
    address = local_address_towards(main_addr) or main_addr
    if not is_local and is_loopback(address):
        address = local_address_towards("192.0.2.1") or address
    return address, next((name for name, addr in interfaces() if addr == address), None)


def wait_listening(endpoint: str, seconds: float, every: float = 0.01) -> bool:
    """Whether something listens at ``endpoint`` (``host:port``, ``[v6]:port``) within ``seconds``,
    tried every ``every`` s (torch's store client backs off a second after a refusal)."""
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        return False
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=max(0.05, min(1.0, seconds))).close()
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(every)


def interfaces() -> List[Tuple[str, str]]:
    """(name, IPv4 address) of every interface that has one, in NCCL's search order."""
    try:
        names = [name for _, name in sorted(socket.if_nameindex())]
    except OSError:
        return []
    out = []
    for name in names:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        out.append((name, socket.inet_ntoa(packed[20:24])))
    return out
