"""The node side of ``restart_scale.py``: ``_gang_nodes.Nodes`` (real,
authenticated ``GangClient``s in a worker process) that also enter a call and
carry out the gang's in-step restart as far as the gang is concerned: each
node hears the ``restart`` message, derives from the bench it carries
(``@torchrun(spares)``: the spares left and the nodes taken out) whether it
trains and its node rank, and meets the others at the fresh rendezvous it
names: node 0 listens on the announced port (the role of its new torchrun's
store), every other active node connects to it; a benched node (the one
taken out, a spare still waiting) connects to nothing.

Only the gang's public entry points are used (``enter_call``,
``report_failure``, ``news.wait_for_restart_or_verdict``). Times are
``time.monotonic()``, one clock for every process of this host.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Dict, List, Tuple

from _gang_nodes import HOST, Nodes, worker_main


class RestartNodes(Nodes):
    def __init__(self) -> None:
        super().__init__()
        self.told_at: Dict[int, float] = {}
        self.agreed_at: Dict[int, float] = {}
        self.heard_at: Dict[int, float] = {}
        # node -> (spares, out, swapped_in, node rank, nodes that train, role): its restart message, as read
        self.derived: Dict[int, Tuple[Any, ...]] = {}
        self.settled: Dict[int, float] = {}  # told and, where active, connected: nothing left to do
        self.entered: Dict[int, Any] = {}
        self._listener: Any = None

    def do_enter(self) -> Dict[str, Any]:
        """Every node of the share enters call 0 (each blocks until its go)."""
        def enter(node: int, client: Any) -> None:
            self.entered[node] = client.enter_call(0, "train.py")

        self.entered = {}
        for n, client in self.clients.items():
            threading.Thread(target=enter, args=(n, client), daemon=True).start()
        return {}

    def do_wait_entered(self, seconds: float) -> Dict[str, Any]:
        deadline = time.monotonic() + seconds
        while len(self.entered) < len(self.clients) and time.monotonic() < deadline:
            time.sleep(0.01)
        return {"entered": len(self.entered)}

    def do_arm(self, bound: float) -> Dict[str, Any]:
        """Watch this share's nodes for the gang's restart of call 0; each
        told node then meets the others at its rendezvous port. One thread
        per worker (not one per node): on one host, a thousand waiting
        threads would measure the scheduler, not the gang."""
        self.told_at, self.agreed_at, self.heard_at, self.derived, self.settled = {}, {}, {}, {}, {}
        for node, client in self.clients.items():
            client.news.heard = self._stamped(node, client.news.heard)  # type: ignore[method-assign]
        threading.Thread(target=self._watch, args=(bound,), daemon=True).start()
        return {}

    def _stamped(self, node: int, heard: Any) -> Any:
        """When the client's reader thread read the restart message (the
        gang's delivery, apart from this harness's watcher)."""
        def stamp(message: Any) -> bool:
            if type(message).__name__ == "Restart":
                self.heard_at.setdefault(node, time.monotonic())
            return heard(message)
        return stamp

    def _watch(self, bound: float) -> None:
        deadline = time.monotonic() + bound
        pending = dict(self.clients)
        todo: List[Tuple[int, int]] = []  # (node, port): told, not yet connected
        while (pending or todo) and time.monotonic() < deadline:
            for node, client in list(pending.items()):
                decided = client.news.restart_after(0, 0)
                if decided is None:
                    continue
                self.told_at[node] = time.monotonic()
                del pending[node]
                bench, seat = decided.bench, _seat(client, decided)
                node_rank = seat.node_rank
                self.derived[node] = (list(bench.spares), list(bench.out), decided.swapped_in, node_rank,
                                      seat.nnodes, seat.role)
                if node_rank is None:  # benched: sits the restart out, meets no one
                    self.settled[node] = self.told_at[node]
                elif node == 0:
                    self._serve(decided.rdzv_port)
                    self.agreed_at[node] = self.settled[node] = time.monotonic()
                else:
                    todo.append((node, decided.rdzv_port))
            todo = [(node, port) for node, port in todo if not self._meet(node, port)]
            time.sleep(0.002)

    def _meet(self, node: int, port: int) -> bool:
        try:
            with socket.create_connection((HOST, port), timeout=1.0) as sock:
                sock.recv(1)  # the "store" answers one byte to each node
        except OSError:
            return False
        self.agreed_at[node] = self.settled[node] = time.monotonic()
        return True

    def _serve(self, port: int) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, port))
        listener.listen(4096)
        self._listener = listener

        def accept() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                try:
                    conn.sendall(b"k")
                finally:
                    conn.close()

        threading.Thread(target=accept, daemon=True).start()

    def do_report_kill(self, node: int) -> Dict[str, Any]:
        """Node ``node`` says one of its ranks was SIGKILLed, as a node's call does."""
        _, _, Cause, CauseKind = self._api
        t = time.monotonic()
        cause = Cause(CauseKind.RANK_FAILED, "harness: rank %d of node %d killed by signal SIGKILL" % (8 * node, node),
                      rank=8 * node, exit_code=-9, exc_type="killed by signal SIGKILL",
                      message="the process ended without a Python exception", call=0)
        self.clients[node].report_failure(cause, call=0, restart=0)
        return {"t": t}

    def do_restart_status(self, seconds: float) -> Dict[str, Any]:
        deadline = time.monotonic() + seconds
        while len(self.settled) < len(self.clients) and time.monotonic() < deadline:
            time.sleep(0.005)
        return {"told": dict(self.told_at), "agreed": dict(self.agreed_at), "heard": dict(self.heard_at),
                "derived": dict(self.derived)}


def _seat(client: Any, decided: Any) -> Any:
    """The node's place in the restart as its client worked it out on the
    reader thread (``client.seats``, what its call launches with), or from
    the bench where a client keeps no seats."""
    seats = getattr(client, "seats", None)
    seat = seats.get((decided.index, decided.restart)) if seats is not None else None
    return seat if seat is not None else decided.bench.seat(client.node_index, client.config.num_nodes)


def restart_worker_main(conn: Any, parent_pid: int) -> None:
    """``_gang_nodes.worker_main``'s loop, with ``RestartNodes``."""
    worker_main(conn, parent_pid, RestartNodes)
