"""Helpers for the gang's tests: real servers, clients and raw sockets on
127.0.0.1, and gang clients in their own processes, all closed at teardown.

A raw socket speaks the wire format by hand (``RawPeer``): that is how tests
play a node that misbehaves, or one that says hello and then nothing.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import uuid
from typing import List, Optional, Sequence, Union

from metaflow_extensions.torchrun.plugins.torchrun.gang import auth as gang_auth
from metaflow_extensions.torchrun.plugins.torchrun.gang import wire
from metaflow_extensions.torchrun.plugins.torchrun.gang.messages import STREAMS, TAIL_LINES, NodeReport, RankStatus
from metaflow_extensions.torchrun.plugins.torchrun.gang.config import GangConfig
from metaflow_extensions.torchrun.plugins.torchrun.gang.client import GangClient
from metaflow_extensions.torchrun.plugins.torchrun.gang.server import GangServer
from metaflow_extensions.torchrun.plugins.torchrun.gang.ports import find_free_port
from proc_helpers import wait_until

HOST = "127.0.0.1"
GUARD = 5.0  # hang guard for what is expected "within about a second"
LONG_HB = 30.0  # a heartbeat timeout no test waits for: only the mechanism under test acts
SECRET = b"s" * 32
PKG_DIR = __import__("os").path.dirname(__import__("os").path.dirname(wire.__file__))

# A gang client in its own process. It loads the gang modules as a package of
# their own (no Metaflow: quick to start), joins, says so, then idles so that
# it can be killed or frozen; a line "leave" on its stdin makes it leave.
SUBPROCESS_CLIENT = r"""
import importlib.util, sys, time
pkg_dir, gang_id, num_nodes, hb, port, node, secret = sys.argv[1:8]
spec = importlib.util.spec_from_file_location(
    "gangpkg", pkg_dir + "/__init__.py", submodule_search_locations=[pkg_dir])
pkg = importlib.util.module_from_spec(spec)
sys.modules["gangpkg"] = pkg
spec.loader.exec_module(pkg)
from gangpkg.gang.config import GangConfig
from gangpkg.gang.client import GangClient
config = GangConfig(gang_id, int(num_nodes), heartbeat_timeout=float(hb), start_timeout=30)
client = GangClient(config, "127.0.0.1", [int(port)], int(node), secret=bytes.fromhex(secret))
client.connect(give_up_after=20)
print("joined" if client.cause is None else "cause %r" % (client.cause,), flush=True)
for line in sys.stdin:
    if line.strip() == "leave":
        client.leave(0, ok=True)
        print("left", flush=True)
while True:
    time.sleep(1)
"""


def new_config(num_nodes: int = 2, **kw) -> GangConfig:
    kw.setdefault("heartbeat_timeout", LONG_HB)
    kw.setdefault("start_timeout", 60.0)
    return GangConfig("gang-%s" % uuid.uuid4().hex[:8], num_nodes, **kw)


def read_line(sock: socket.socket, timeout: float = GUARD) -> dict:
    """One message; ``{}`` when the peer hung up first."""
    sock.settimeout(timeout)
    data = b""
    while b"\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return {}
        data += chunk
    return json.loads(data.split(b"\n", 1)[0])


def closed_by_peer(sock: socket.socket, timeout: float = GUARD) -> bool:
    """The peer hung up (whatever it sent before that is skipped)."""
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


class RawPeer:
    """A node played by hand over a raw socket."""

    def __init__(self, port: int, timeout: float = GUARD):
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.challenge: Optional[dict] = None

    def read_challenge(self) -> dict:
        self.challenge = read_line(self.sock)
        return self.challenge

    def hello(self, config: GangConfig, node: int, secret: bytes = SECRET, host: str = "raw-node",
              **override) -> dict:
        """Answer the challenge as node ``node``; the service's reply."""
        challenge = self.challenge or self.read_challenge()
        message = gang_auth.hello(
            secret, config.gang_id, bytes.fromhex(challenge["nonce"]), node, host=host, pid=1).to_wire()
        message.update(override)
        self.send(message)
        return read_line(self.sock)

    def send(self, message: dict) -> None:
        self.sock.sendall(wire.encode(message))

    def close(self) -> None:
        wire.close_quietly(self.sock)


class Net:
    """Makes servers, clients, raw peers and subprocess nodes; closes them all."""

    def __init__(self, procs=None) -> None:
        self.servers: List[GangServer] = []
        self.clients: List[GangClient] = []
        self.socks: List[socket.socket] = []
        self.raws: List[RawPeer] = []
        self.procs = procs

    def server(self, num_nodes: int = 2, config: Optional[GangConfig] = None,
               ports: Optional[Sequence[int]] = None, secret: bytes = SECRET, hooks: Optional[dict] = None,
               **kw) -> GangServer:
        """``hooks``: the service's constructor's callbacks (progress, host_check, node_ends)."""
        config = config or new_config(num_nodes, **kw)
        s = GangServer(config, HOST, list(ports or [find_free_port()]), secret=secret, **(hooks or {}))
        self.servers.append(s)
        return s.start()

    def client(self, config: GangConfig, port: Union[int, Sequence[int]], node: int,
               connect: bool = True, give_up_after: float = GUARD, secret: bytes = SECRET, **hooks) -> GangClient:
        """``hooks``: the client's constructor's callbacks (on_abort, progress, preflight, facts)."""
        ports = [port] if isinstance(port, int) else list(port)
        c = GangClient(config, HOST, ports, node, secret=secret, **hooks)
        self.clients.append(c)
        if connect:
            c.connect(give_up_after=give_up_after)
        return c

    def join(self, server: GangServer, nodes: Sequence[int]) -> List[GangClient]:
        clients = [self.client(server.config, server.port, n) for n in nodes]
        for c in clients:
            assert c.cause is None and c._sock is not None, c.cause
        return clients

    def raw(self, port: int) -> RawPeer:
        r = RawPeer(port)
        self.raws.append(r)
        return r

    def listener(self) -> socket.socket:
        s = socket.socket()
        self.socks.append(s)
        s.bind((HOST, 0))
        s.listen(64)
        return s

    def subprocess_node(self, server: GangServer, node: int, secret: bytes = SECRET) -> subprocess.Popen:
        assert self.procs is not None, "use the procs fixture"
        config = server.config
        p = self.procs.popen(
            [sys.executable, "-c", SUBPROCESS_CLIENT, PKG_DIR, config.gang_id, str(config.num_nodes),
             str(config.heartbeat_timeout), str(server.port), str(node), secret.hex()],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
        line = p.stdout.readline().decode().strip()
        assert line == "joined", line
        assert wait_until(lambda: node in server.handlers.members.joined_at, GUARD)
        return p

    def close(self) -> None:
        for c in self.clients:
            c.close()
        for r in self.raws:
            r.close()
        for s in self.socks:
            wire.close_quietly(s)
        for s in self.servers:
            s.close()


def wait_cause(clients, timeout: float = GUARD):
    assert wait_until(lambda: all(c.cause is not None for c in clients), timeout), [
        (c.node_index, c.cause) for c in clients
    ]
    return [c.cause for c in clients]


def node_report(*ranks: int, tail_chars: int = 0) -> NodeReport:
    """A node's report on ``ranks``; ``tail_chars``: each of its 20 tail lines
    per stream that long (a big report)."""
    line = "t" * tail_chars
    tails = {r: {s: (line,) * TAIL_LINES for s in STREAMS} for r in ranks} if tail_chars else {}
    return NodeReport(ranks=tuple(RankStatus(r, r) for r in ranks), tails=tails)


def enter_everywhere(server, clients, index: int = 0) -> Optional[int]:
    """Every client enters call ``index`` at once; the call's rendezvous port
    once every node is there (the service's ``all_entered_at``)."""
    import threading
    threads = [threading.Thread(target=c.enter_call, args=(index, "train.py"), daemon=True) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(GUARD)
    assert wait_until(lambda: server.handlers.book.calls[index].all_entered_at is not None, GUARD)
    return server.handlers.book.calls[index].rdzv_port
