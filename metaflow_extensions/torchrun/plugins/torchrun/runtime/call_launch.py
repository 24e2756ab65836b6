"""How one node launches its share of a call: the work directory, the entry
file, torchrun's argv and environment; and, for each in-step restart the gang
decides (``@torchrun(restarts)``), the next start of the ranks on the fresh
rendezvous the gang announced, with the replaced ranks' records cleared. A
mixin of ``CallRun`` (``call.py``), which holds the state it sets."""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional, Tuple

from ..errors import TorchrunInvalidArgument
from ..gang import Seat
from .. import timeouts
from ..host import CallFiles, route_to, say, wait_listening
from ..launch import CallPlan, NodeFacts, prepare_launch
from ..procs import ARGS_FILE, RESTART_ENV, ZYGOTE_ENV, RankFailure, bootstrap, clear_round, entry, functions
from .restarts import CallRestarts
from ..record import read_rank_records
from .session import GangSession
from .supervisor import Supervisor
from .warm_start import WarmStart


class CallLaunch:
    # CallRun's state, set here and read there.
    session: GangSession
    plan: CallPlan
    index: int
    workdir: str
    log_dir: Optional[str]
    local_addr: str
    rdzv_port: Optional[int]
    rdzv_id: str  # torchrun's rendezvous id for the call's first start
    argv: List[str]
    exit_code: Optional[int]
    failures: List[RankFailure]
    supervisor: Optional[Supervisor]
    files: Optional[CallFiles]
    again: CallRestarts
    warm: Optional[WarmStart]
    seat: Optional[Seat]
    _entry: Tuple[str, Optional[str]]

    def prepare(self) -> Dict[str, str]:
        topology, session = self.session.topology, self.session
        self.local_addr, iface = session.route or route_to(topology.main_addr, topology.is_local)
        log_key, self.rdzv_id = session.identity.call_names(self.index)
        # Private to this user; the work directory goes in record() (workdirs.py).
        self.files = CallFiles(log_key, topology.node_index, base=session.host_base, prune_first=False,
                               knobs=session.defaults.knobs)
        self.workdir, self.log_dir = self.files.work_dir, self.files.log_dir
        # The step's, importing torch since the gang began to form.
        self.warm = WarmStart.for_call(getattr(self.session, "warm", None), self.workdir, self.log_dir,
                                       session.defaults.knobs.warm_start)
        plan = self.plan
        if plan.function is not None:
            try:
                functions.write_pickle(os.path.join(self.workdir, ARGS_FILE), plan.function_args)
            except Exception as e:
                raise TorchrunInvalidArgument("entrypoint_args cannot be pickled for the ranks: %s" % e) from None
            bootstrap_argv = [bootstrap.FUNCTION_FLAG, plan.function.encode(), self.workdir]
        else:
            bootstrap_argv = [plan.script or ""] + list(plan.entry_argv)
        # The script and its arguments reach the bootstrap through a file, never
        # through torchrun's own parser (entry.py): arguments stay verbatim.
        self._entry = (entry.write_entry(self.workdir, bootstrap_argv, session.defaults.knobs.trainer_progress), iface)
        return self._launch_environment()

    def _launch_environment(self) -> Dict[str, str]:
        """torchrun's argv and environment for this start of the ranks: a
        restart has a rendezvous of its own (a fresh id, the port the gang
        announced), the same static shape (rank 0 on node 0)."""
        topology, restart, (entry_path, iface) = self.session.topology, self.again.restart, self._entry
        seat = self.seat or self.session.bench.seat(topology.node_index, topology.num_nodes)
        if seat.node_rank is None:  # benched (@torchrun(spares)): nothing to launch until a restart brings it in
            self.argv = []
            return {}
        node = NodeFacts(
            python=sys.executable, node_index=topology.node_index, node_rank=seat.node_rank, num_nodes=seat.nnodes,
            main_addr=topology.main_addr, local_addr=self.local_addr, iface=iface, rdzv_port=int(self.rdzv_port or 0),
            rdzv_id=self.rdzv_id + ("-r%d" % restart if restart else ""),
            workdir=self.workdir, log_dir=self.log_dir, entry_path=entry_path, flow_dir=self.session.flow_dir,
        )
        self.argv, env = prepare_launch(self.plan, self.session.defaults, node, os.environ)
        if restart:
            env[RESTART_ENV] = str(restart)
        assert self.warm is not None  # prepare() chose it
        env = self.warm.for_ranks(env, self.plan.nproc if isinstance(self.plan.nproc, int) else 1)
        endpoint = _option(self.argv, "rdzv-endpoint")
        if ZYGOTE_ENV in env and topology.node_index != 0 and endpoint:
            wait_listening(endpoint, timeouts.STORE_WAIT)  # node 0's store first: no backoff in torch's client
        return env

    def _restart(self, decided: Any) -> Dict[str, str]:
        """Carry out restart ``decided.restart``: this node's old ranks are
        gone (the supervisor stopped them); the next start's rendezvous and
        environment, with the replaced ranks' records cleared."""
        sup = self.supervisor
        self.again.begin(decided, sup.started_at if sup else None, sup.ended_at if sup else None, self._rank_starts())
        assert self.session.client is not None
        self.seat = self.session.client.seats.get((decided.index, decided.restart))
        self.session.bench = decided.bench
        clear_round(self.workdir)
        self.failures, self.exit_code = [], None
        if self.plan.rdzv_port is None:  # pinned: the same port for every start
            self.rdzv_port = decided.rdzv_port
        if self.session.is_control and decided.swapped_in is not None:
            server = self.session.server
            say(swap_line(self.index, decided, self.session.defaults.restarts, server.hosts() if server else {}))
        elif self.session.is_control:
            say("call %d: restarting every node's ranks (restart %d of %d): %s"
                % (self.index + 1, decided.restart, self.session.defaults.restarts, decided.cause.summary))
        return self._launch_environment()

    def release(self) -> None:
        """The call's own warm process (not the step's) and the work directory go, whatever happened."""
        if self.warm is not None and self.warm is not getattr(self.session, "warm", None):
            self.warm.close()
        if self.files is not None:
            self.files.close()

    def _rank_starts(self) -> List[Optional[float]]:
        return [r.start for r in read_rank_records(self.workdir, []) if (r.restart or 0) == self.again.restart] \
            if self.workdir else []


def _option(argv: List[str], name: str) -> Optional[str]:
    """The value torchrun's argv gives option ``name`` (either spelling; the last wins)."""
    found = None
    spellings = ("--" + name, "--" + name.replace("-", "_"))
    for i, arg in enumerate(argv):
        key, eq, value = arg.partition("=")
        if key in spellings:
            found = value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return found


def swap_line(index: int, decided: Any, restarts: int, hosts: Dict[int, str]) -> str:
    """The console's one line for a swap: which node and host went out and why, which spare came in."""
    return ("call %d: node %d (%s) taken out, spare node %d (%s) brought in (restart %d of %d): %s"
            % (index + 1, decided.swapped_out, hosts.get(decided.swapped_out, "?"), decided.swapped_in,
               hosts.get(decided.swapped_in, "?"), decided.restart, restarts, decided.cause.summary))
