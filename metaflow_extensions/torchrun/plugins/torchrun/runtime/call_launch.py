"""This node's share of one call made concrete (``NodeLaunch``): its private directories, the warm process
its ranks fork from, the entry file, and each start of the ranks (``RanksStart``: torchrun's argv and
environment). ``NodeLaunch.start`` is the one place a start gets its environment, the first and every
restart or swap alike; ``call.py`` owns the launch, ``restart_loop.py`` decides when a start happens."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ..gang import Seat
from ..gang import messages as msg
from ..base import timeouts
from ..host.network import route_to, wait_listening
from ..host.private import open_private
from ..host.workdirs import CallFiles
from ..launch import CallPlan
from ..launch.prepare import NodeFacts, prepare_launch
from ..procs.names import ARGS_FILE, RESTART_ENV, ZYGOTE_ENV
from ..procs import bootstrap, entry
from ..record.result import read_rank_records
from .call_snapshots import CallSnapshots
from .session import GangSession
from .warm_start import WarmStart


@dataclass(frozen=True)
class RanksStart:
    """One start of this node's ranks: start 0 is the call's first, start k the gang's restart k."""

    restart: int
    seat: Optional[Seat]  # this node's place in it, as the gang said it (None: not said, every node active)
    rdzv_port: int  # torchrun's rendezvous port for this start
    argv: Tuple[str, ...] = ()  # torchrun's command line; empty where this node sits the start out
    env: Dict[str, str] = dataclasses.field(default_factory=dict)  # the agent's and the ranks' environment

    @property
    def benched(self) -> bool:
        """A spare, or a node taken out (@torchrun(spares)): no ranks here until a restart brings it in."""
        return self.seat is not None and self.seat.node_rank is None


@dataclass
class NodeLaunch:
    session: GangSession
    plan: CallPlan
    index: int
    snapshots: CallSnapshots  # the call's snapshot store, opened before the call is entered
    workdir: str = ""
    log_dir: Optional[str] = None
    local_addr: str = ""
    rdzv_id: str = ""  # torchrun's rendezvous id for the call's first start
    files: Optional[CallFiles] = None  # work and log directories (workdirs.py)
    warm: Optional[WarmStart] = None  # the node's warm process (warm_start.py), chosen in prepare()
    entry: Tuple[str, Optional[str]] = ("", None)  # the entry file, the interface to the control

    def prepare(self, seat: Optional[Seat], rdzv_port: int) -> RanksStart:
        """The call's directories, warm process and entry file; the first start."""
        session, context = self.session, self.session.context
        topology = context.topology
        self.local_addr, iface = context.route if context.route[0] else route_to(topology.main_addr, topology.is_local)
        log_key, self.rdzv_id = context.identity.call_names(self.index)
        # Private to this user; the work directory goes in release() (workdirs.py).
        self.files = CallFiles(log_key, topology.node_index, base=context.host_base, prune_first=False,
                               knobs=context.defaults.knobs)
        self.workdir, self.log_dir = self.files.work_dir, self.files.log_dir
        # The step's, importing torch since the gang began to form.
        self.warm = WarmStart.for_call(context.warm, self.workdir, self.log_dir,
                                       session.context.defaults.knobs.warm_start)
        plan = self.plan
        if plan.function is not None:
            args_file = os.path.join(self.workdir, ARGS_FILE)
            with os.fdopen(open_private(args_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
                f.write(plan.function_pickle)  # planning pickled them, once
            bootstrap_argv = [bootstrap.FUNCTION_FLAG, plan.function.encode(), self.workdir]
        else:
            bootstrap_argv = [plan.script or ""] + list(plan.entry_argv)
        # The script and its arguments reach the bootstrap in a file, not through torchrun's parser: verbatim.
        knobs = context.defaults.knobs
        self.entry = (entry.write_entry(self.workdir, bootstrap_argv, knobs.trainer_progress, knobs.arrivals), iface)
        return self.start(seat, rdzv_port, 0)

    def start(self, seat: Optional[Seat], rdzv_port: int, restart: int) -> RanksStart:
        """Start ``restart`` of the ranks, with torchrun's argv and environment (none where ``seat`` sits it
        out): a restart's rendezvous has a fresh id and the port the gang announced, the same shape (rank 0
        on node 0). Every start's environment is made here, and only here."""
        topology, (entry_path, iface) = self.session.context.topology, self.entry
        placed = seat or self.session.bench.seat(topology.node_index, topology.num_nodes)
        if placed.node_rank is None:  # benched (@torchrun(spares)): nothing to launch until a restart brings it in
            return RanksStart(restart, seat, rdzv_port)
        node = NodeFacts(
            python=sys.executable, node_index=topology.node_index, node_rank=placed.node_rank, num_nodes=placed.nnodes,
            main_addr=topology.main_addr, local_addr=self.local_addr, iface=iface, rdzv_port=rdzv_port,
            rdzv_id=self.rdzv_id + ("-r%d" % restart if restart else ""),
            workdir=self.workdir, log_dir=self.log_dir, entry_path=entry_path, flow_dir=self.session.context.flow_dir,
        )
        argv, env, endpoint = prepare_launch(self.plan, self.session.context.defaults, node, os.environ)
        if restart:
            env[RESTART_ENV] = str(restart)
        self.snapshots.follow()  # a spare brought in: where the replaced node's state is, before its ranks ask
        self.snapshots.started(restart)
        env.update(self.snapshots.environ())
        assert self.warm is not None  # prepare() chose it
        env = self.warm.for_ranks(env, self.plan.nproc if isinstance(self.plan.nproc, int) else 1)
        if ZYGOTE_ENV in env and topology.node_index != 0:
            wait_listening(endpoint, timeouts.STORE_WAIT)  # node 0's store first: no backoff in torch's client
        return RanksStart(restart, seat, rdzv_port, tuple(argv), env)

    def release(self) -> None:
        """The call's own warm process (not the step's) and the work directory go, whatever happened."""
        if self.warm is not None and self.warm is not self.session.context.warm:
            self.warm.close()
        self.snapshots.close()
        if self.files is not None:
            self.files.close()

    def rank_starts(self, restart: int) -> List[Optional[float]]:
        """When each of this node's ranks of start ``restart`` reached the user's script (their status files)."""
        return [r.start for r in read_rank_records(self.workdir, []) if (r.restart or 0) == restart] \
            if self.workdir else []


def swap_line(index: int, decided: msg.Restart, restarts: int, hosts: Dict[int, str]) -> str:
    """The console's one line for a swap: which node and host went out and why, which spare came in."""
    out, spare = decided.swapped_out, decided.swapped_in
    return ("call %d: node %s (%s) taken out, spare node %s (%s) brought in (restart %d of %d): %s"
            % (index + 1, out, hosts.get(out, "?") if out is not None else "?", spare,
               hosts.get(spare, "?") if spare is not None else "?", decided.restart, restarts,
               decided.cause.summary))
