"""``@torchrun(preflight=...)`` in the step (docs/preflight.md): each node's
fingerprint sent with its join, for the service to compare before any rank starts;
"full" also runs a collective job (``procs/collective_check.py``) before the first call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import functools
import logging
import os
import threading
import time
from typing import Dict, List, Optional

from ..cause import Cause, CauseKind
from ..gang import messages as msg
from ..gang import node_compare as verdicts
from ..gang import preflight_modes as modes
from ..host import cuda_devices, interfaces, route_to, work_root
from ..launch import node_checks as checks
from ..launch import plan_call
from ..procs import collective_check
from .call import CallRun
from .session import GangSession, say
from ..base import timeouts
from ..base.knobs import Knobs
from ..record import Previous, node_history

_log = logging.getLogger("metaflow_torchrun")


def measure(session: GangSession) -> msg.Preflight:
    """What this node measures and sends right after joining."""
    defaults, topology = session.defaults, session.topology
    addr, iface = route_to(topology.main_addr, topology.is_local)
    return checks.measure(topology.node_index, checks.default_nproc(defaults.nproc_per_node, defaults.derived_nproc),
                          defaults.accelerators, os.environ, work_root(), addr, iface, interfaces())


def attach(session: GangSession, history: Optional["History"] = None) -> None:
    """Before ``session.join``: the preflight travels with the join; on the control, the
    node history checks the gang's hosts once all are in."""
    if session.defaults.preflight != modes.OFF:
        session.preflight_source = functools.partial(measure, session)
        session.preflight.mode = session.defaults.preflight
        if history is not None and session.is_control:
            session.preflight.history = history
            session.preflight.host_check = node_history.host_check(
                history.get, history.threshold, session.defaults.preflight == modes.STRICT,
                node_history.platform_of(os.environ))


class History:
    """The node history, read in the background from the control task's start: never on the critical path."""

    def __init__(self, flow: str, run_id: str, step: str, previous: Optional[Previous], knobs: Knobs):
        self.threshold = node_history.Threshold(*knobs.node_history) if knobs.node_history else None
        self.runs = knobs.node_history_runs
        self.seen: List[node_history.Appearance] = node_history.appearances(
            previous.attempts if previous is not None else (), flow, run_id, step)
        self.error: Optional[str] = None
        self._done = threading.Event()
        threading.Thread(target=self._read, args=(flow, run_id, step), name="torchrun-node-history",
                         daemon=True).start()

    def _read(self, flow: str, run_id: str, step: str) -> None:
        try:
            if self.runs > 0 and self.threshold is not None:
                self.seen = self.seen + node_history.read(flow, last=self.runs + 1, skip_run=run_id, steps=[step])
        except Exception as e:  # a history that cannot be read never stops the step
            self.error = "%s: %s" % (type(e).__name__, e)
            _log.debug("node history: %s", self.error)
        finally:
            self._done.set()

    def get(self) -> Optional[List[node_history.Appearance]]:
        return self.seen if self._done.wait(timeouts.HISTORY_WAIT) else None


def backend(session: GangSession) -> str:
    gpu = session.defaults.accelerators.kind == "gpu" and (cuda_devices(os.environ) or 0) > 0
    return "nccl" if gpu else "gloo"


def before_first_call(session: GangSession) -> None:
    """``preflight="full"``'s collective job, once per attempt, before the step's first call."""
    if session.defaults.preflight != modes.FULL or session.calls_made or session.preflight.job_ran:
        return
    session.preflight.job_ran = True
    plan = plan_call(collective_check.preflight_job, {"backend": backend(session)}, None, None,
                     session.defaults, [os.getcwd()])
    began = time.monotonic()
    with session.in_call() as index:
        deadlines = JobDeadlines(session.defaults.heartbeat_timeout, plan.nproc if isinstance(plan.nproc, int) else 1,
                                 session.topology.node_index, index)
        result = CallRun(session, plan, index, watch=deadlines).run()
    if session.is_control:
        job = verdicts.job_record(result.returns.get(0), time.monotonic() - began)
        session.preflight.job = job
        for line in verdicts.describe_job(job) + slower_than_before(session, job):
            say("preflight: " + line)


def slower_than_before(session: GangSession, job: verdicts.JobRecord) -> List[str]:
    """Nodes whose bandwidth now is under their host's own past (the node history)."""
    history = session.preflight.history
    seen = history.get() if history is not None else None
    if not seen or session.server is None:
        return []
    hosts = session.server.hosts()
    found = [(node, node_history.slower_than_its_past(hosts.get(node, "?"), gbps, seen))
             for node, gbps in sorted(job.link_gbps.items())]
    return ["node %d: %s" % (node, why) for node, why in found if why][:node_history.MAX_FLAGGED]


@dataclass
class JobDeadlines:
    """The job's own deadlines, asked by its call (``CallRun.watch``). From when every rank
    here has started, ``heartbeat_timeout`` later a rank outside any collective is named
    (ranks not started ``2 x`` that after the go too); nodes waiting in a collective report
    an echo only after ``2 x heartbeat_timeout + ECHO_DELAY``, so the node to name comes first."""

    limit: float  # heartbeat_timeout
    nproc: int
    node_index: int
    call: int
    stuck: str = ""  # why this node is the one to name
    overdue: bool = False
    go_at: float = field(default_factory=time.monotonic)
    started_at: Optional[float] = None

    def went(self) -> None:
        self.go_at = time.monotonic()

    def stop_reason(self, workdir: str) -> Optional[str]:
        now, limit = time.monotonic(), self.limit
        phases = self._phases(workdir)
        if self.started_at is None:
            if all(p is not None for p in phases.values()):
                self.started_at = now
            elif now >= self.go_at + 2 * limit:
                self.stuck = _outside(phases) + " (not started %gs after the go)" % (2 * limit)
            if not self.stuck:
                return None
        elif now >= self.started_at + limit:
            self.stuck = _outside(phases)
            if not self.stuck and now < self.started_at + 2 * limit + timeouts.ECHO_DELAY:
                return None
        else:
            return None
        self.overdue = True
        return "the preflight job overran heartbeat_timeout"

    def own_cause(self, cause: Cause) -> Cause:
        """This node's cause: ``cause`` (as any call's) unless a deadline passed."""
        if not self.overdue:
            return cause
        if self.stuck:
            return Cause(CauseKind.PREFLIGHT, "preflight job: node %d did not get through its collectives within "
                         "%gs (heartbeat_timeout): %s, outside any collective, while its peers waited"
                         % (self.node_index, self.limit, self.stuck), node_index=self.node_index, call=self.call)
        return Cause(CauseKind.PREFLIGHT, "preflight job: node %d waited over %gs in a collective for another node"
                     % (self.node_index, 2 * self.limit), node_index=self.node_index, call=self.call, secondary=True)

    def _phases(self, workdir: str) -> Dict[int, Optional[str]]:
        return {local: collective_check.read_phase(workdir, local) if workdir else None
                for local in range(self.nproc)}


def _outside(phases: Dict[int, Optional[str]]) -> str:
    """The local ranks that are not waiting inside a collective, and where."""
    return ", ".join("local rank %d %s" % (local, "in %r" % phase if phase else "not started")
                     for local, phase in sorted(phases.items()) if phase not in collective_check.WAITING)
