"""The node side of the gang scale harness (``gang_scale.py``): one worker
process holding a share of a gang's nodes, each a real, authenticated
``GangClient``, driven by commands from the harness over a pipe.

Only the gang's public entry points are used (``GangConfig``, ``GangClient``,
``connect``, ``cause``, ``on_abort``, ``report_failure``, ``close``): the
harness must keep measuring while the service and the client are rewritten.

Bytes are counted by the kernel, not by wrapping the client: every TCP socket
of this process connected to the service's port is found through
``/proc/self/fd`` and asked for ``TCP_INFO``, whose ``tcpi_bytes_received`` is
what the service sent to that node (payload bytes, no headers) and
``tcpi_bytes_sent`` what the node sent. Linux only.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import stat
import struct
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

HOST = "127.0.0.1"
# Thread stacks in a worker: two threads per client (reader, heartbeat) and one
# per joining client; 256 KiB keeps a thousand of them small.
STACK_BYTES = 256 * 1024
# struct tcp_info (linux/tcp.h): u64 tcpi_bytes_acked at 120, u64 tcpi_bytes_received
# at 128; u64 tcpi_bytes_sent at 200 since Linux 4.19 (acked lags what was sent by
# a delayed ACK, up to a heartbeat here: sent is used where the kernel has it).
_TCP_INFO = getattr(socket, "TCP_INFO", 11)
_ACKED_AT, _RECEIVED_AT, _SENT_AT = 120, 128, 200


def raise_nofile() -> int:
    """Soft RLIMIT_NOFILE up to the hard one: a thousand sockets need it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def tcp_counters(port: int, local: bool) -> List[Tuple[int, int]]:
    """(bytes received, bytes sent) of each connected TCP socket of
    this process whose peer port (``local=False``: a client's sockets) or own
    port (``local=True``: the service's accepted sockets) is ``port``."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            dup = os.dup(fd)
        except (ValueError, OSError):
            continue
        try:
            sock = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)
            continue
        with sock:  # closes the duplicate only
            counters = _counters_of(sock, port, local)
        if counters is not None:
            found.append(counters)
    return found


def _counters_of(sock: socket.socket, port: int, local: bool) -> Optional[Tuple[int, int]]:
    try:
        if sock.family != socket.AF_INET or sock.type != socket.SOCK_STREAM:
            return None
        peer_port = sock.getpeername()[1]
        own_port = sock.getsockname()[1]
        if (own_port if local else peer_port) != port:
            return None
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 256)
    except OSError:
        return None  # not connected (a listener), or gone meanwhile
    if len(info) < _RECEIVED_AT + 8:
        return None
    (received,) = struct.unpack_from("=Q", info, _RECEIVED_AT)
    (sent,) = struct.unpack_from("=Q", info, _SENT_AT if len(info) >= _SENT_AT + 8 else _ACKED_AT)
    return received, sent


def _die_with_parent(parent_pid: int) -> None:
    """A worker never outlives the harness, even one killed with SIGKILL, and
    even while this worker is stopped (SIGKILL reaches a stopped process)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=watch, name="harness-watchdog", daemon=True).start()


def _kind(cause: Any) -> str:
    kind = getattr(cause, "kind", None)
    return str(getattr(kind, "value", kind))


class Nodes:
    """This worker's share of one gang at a time."""

    def __init__(self) -> None:
        import metaflow  # noqa: F401  (the package expects Metaflow imported first)
        from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
        from metaflow_extensions.torchrun.plugins.torchrun.gang.client import GangClient
        from metaflow_extensions.torchrun.plugins.torchrun.gang.config import GangConfig

        self._api = (GangConfig, GangClient, Cause, CauseKind)
        self.clients: Dict[int, Any] = {}
        self.joined_at: Dict[int, float] = {}
        self.cause_at: Dict[int, float] = {}
        self.port = 0

    def do_join(self, gang_id: str, num_nodes: int, heartbeat_timeout: float, start_timeout: float,
                port: int, secret: bytes, nodes: List[int], give_up_after: float,
                progress: bool = False) -> Dict[str, Any]:
        """Every node of the share starts joining at once (a join storm); with
        ``progress``, every heartbeat carries its node's 8 ranks summed up
        (``NodeProgress``, as a real node's ``ProgressTracker`` makes it)."""
        GangConfig, GangClient, _, _ = self._api
        config = GangConfig(gang_id, num_nodes, heartbeat_timeout=heartbeat_timeout, start_timeout=start_timeout)
        self.port = port
        self.joined_at, self.cause_at = {}, {}
        self.clients = {n: GangClient(config, HOST, [port], n, secret=secret, on_abort=self._stamper(n))
                        for n in nodes}
        if progress:  # as a call's start does, for the share's whole life (held: one collected would exit)
            self.watching = [client.watching(lambda: None, _training(n)) for n, client in self.clients.items()]
            for watching in self.watching:
                watching.__enter__()
        first = last = time.monotonic()
        for n, client in self.clients.items():
            # stamped before the start: a client can join before start() returns, and "last start -> all
            # joined" must not read below zero (it did once in CI, -0.6 ms)
            last = time.monotonic()
            threading.Thread(target=self._connect, args=(n, client, give_up_after), daemon=True).start()
        return {"first_start": first, "last_start": last, "threads": threading.active_count()}

    def _stamper(self, node: int) -> Callable[[Any], None]:
        def stamp(cause: Any) -> None:
            self.cause_at.setdefault(node, time.monotonic())

        return stamp

    def _connect(self, node: int, client: Any, give_up_after: float) -> None:
        client.connect(give_up_after=give_up_after)
        if client.cause is None:
            self.joined_at[node] = time.monotonic()

    def do_wait_joined(self, seconds: float) -> Dict[str, Any]:
        deadline = time.monotonic() + seconds
        while len(self.joined_at) < len(self.clients) and time.monotonic() < deadline:
            time.sleep(0.02)
        return {"joined": len(self.joined_at), "last_joined": max(self.joined_at.values(), default=None),
                "threads": threading.active_count()}

    def do_counters(self) -> Dict[str, Any]:
        return {"counters": tcp_counters(self.port, local=False)}

    def do_report(self, node: int, stop: bool = False) -> Dict[str, Any]:
        """Node ``node`` says one of its ranks failed, as a session would; or,
        with ``stop``, that it was told to stop (SIGTERM), as a call's
        ``GangStop`` does (runtime/stop.py)."""
        _, _, Cause, CauseKind = self._api
        t = time.monotonic()
        if stop:
            from metaflow_extensions.torchrun.plugins.torchrun.runtime.stop import preempted

            self.clients[node].report_failure(preempted(node, "SIGTERM", 30.0, 30.0, call=0), call=0)
        else:
            self.clients[node].report_failure(
                Cause(CauseKind.RANK_FAILED, "harness: a rank of node %d failed" % node, rank=8 * node, exit_code=1))
        return {"t": t}

    def _stamp_polled(self) -> None:
        """``on_abort`` stamps a cause as it is set; this catches a client that
        set one without calling it (a rewrite may)."""
        now = time.monotonic()
        for n, client in self.clients.items():
            if client.cause is not None:
                self.cause_at.setdefault(n, now)

    def do_wait_causes(self, seconds: float) -> Dict[str, Any]:
        deadline = time.monotonic() + seconds
        while True:
            self._stamp_polled()
            if len(self.cause_at) >= len(self.clients) or time.monotonic() >= deadline:
                break
            time.sleep(0.005)
        return self.do_status()

    def do_status(self) -> Dict[str, Any]:
        """Each client that has a cause: when it was seen, its kind, whom it names."""
        self._stamp_polled()
        return {"causes": {n: (self.cause_at[n], _kind(c.cause), getattr(c.cause, "node_index", None),
                               str(getattr(c.cause, "summary", ""))[:300])
                           for n, c in self.clients.items() if c.cause is not None and n in self.cause_at}}

    def do_close(self, seconds: float) -> Dict[str, Any]:
        """Close every client, a few at a time in parallel, within ``seconds``."""
        clients = list(self.clients.values())
        self.clients = {}
        chunks = [clients[i::16] for i in range(16)]
        threads = [threading.Thread(target=lambda c=chunk: [x.close() for x in c], daemon=True) for chunk in chunks]
        for t in threads:
            t.start()
        deadline = time.monotonic() + seconds
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return {"closed": not any(t.is_alive() for t in threads)}


def _training(node: int) -> Callable[[], Any]:
    """A node of 8 ranks training at about 2 steps/s (node 7 at half that), with 3 metrics."""
    from metaflow_extensions.torchrun.plugins.torchrun.gang.gang_progress import NodeProgress

    started = time.monotonic()
    rate = 1.0 if node == 7 else 2.0 + (node % 5) * 0.01

    def sample() -> Any:
        step = int((time.monotonic() - started) * rate)
        return NodeProgress(ranks=8, step_min=max(0, step - 1), step_median=step, step_max=step + 1, total=100000,
                            rate=rate, rate_min=rate * 0.98, slowest_rank=8 * node + 3, rank_lo=8 * node,
                            rank_hi=8 * node + 7, stalled=0.2, cpu=0.95,
                            metrics={"loss": 2.5 / (1 + step), "lr": 3e-4, "tokens_per_s": 51234.0})

    return sample


def worker_main(conn: Any, parent_pid: int, make_nodes: Any = None) -> None:
    """A worker's command loop: (command, arguments) in, a dict out, until
    "exit" or the harness goes away. ``make_nodes``: the class whose
    ``do_<command>`` methods answer (``Nodes`` by default)."""
    _die_with_parent(parent_pid)
    raise_nofile()
    threading.stack_size(STACK_BYTES)
    nodes = (make_nodes or Nodes)()
    conn.send({"ready": os.getpid()})
    while True:
        try:
            command, args = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            break
        if command == "exit":
            break
        try:
            reply = getattr(nodes, "do_" + command)(**args)
        except Exception as e:
            reply = {"error": "%s: %s" % (type(e).__name__, e)}
        try:
            conn.send(reply)
        except (OSError, ValueError):
            break
    os._exit(0)
