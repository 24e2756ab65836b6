"""``@torchrun(preflight=...)`` (docs/preflight.md), entered here. Its parts:

- ``launch/node_checks.py``: what each node measures (versions, /dev/shm, disk, GPUs, network), sent
  with its join (``measure``, the client's preflight source);
- ``gang/node_compare.py`` and ``gang/preflight_modes.py``: the service compares every node's
  findings once all are in; the modes' words;
- ``record/node_history.py``: the hosts' past failures, read in the background on the control
  (``History``) and checked by the service (``Hooks.host_check``);
- ``procs/collective_check.py``: "full"'s collective job, run as the step's call 0 before its
  first call (``runtime/api.py``), with its own deadlines (``JobDeadlines``);
- ``card/preflight.py``: its section of the card.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from ..base import timeouts
from ..base.knobs import Knobs
from ..cause import Cause, CauseKind
from ..gang import messages as msg
from ..gang import node_compare as verdicts
from ..gang import preflight_modes as modes
from ..gang.node_compare import HostCheck
from ..gang.topology import Topology
from ..host.devices import cuda_devices
from ..host.network import interfaces
from ..host.workdirs import work_root
from ..launch import CallPlan, StepDefaults, plan_call
from ..launch import node_checks as checks
from ..procs import collective_check
from ..record.attempts import Previous
from ..record import node_history

_log = logging.getLogger("metaflow_torchrun")


@dataclass(frozen=True)
class Hooks:
    """What the step's preflight hands the gang: its mode (None: off), what this node measures (the
    client sends it with its join) and, on the control, the check of the hosts' history (the service's)."""

    mode: Optional[str] = None
    measure: Optional[Callable[[], msg.Preflight]] = None
    host_check: Optional[HostCheck] = None
    history: Optional["History"] = None


def hooks(defaults: StepDefaults, topology: Topology, route: Tuple[str, Optional[str]],
          history: Optional["History"] = None) -> Hooks:
    if defaults.preflight == modes.OFF:
        return Hooks()
    control = history if topology.is_control else None
    check = None if control is None else node_history.host_check(
        control.get, control.threshold, defaults.preflight == modes.STRICT, node_history.platform_of(os.environ))
    return Hooks(defaults.preflight, lambda: measure(defaults, topology, route), check, control)


def measure(defaults: StepDefaults, topology: Topology, route: Tuple[str, Optional[str]]) -> msg.Preflight:
    """What this node measures and sends right after joining."""
    addr, iface = route
    return checks.measure(topology.node_index, checks.default_nproc(defaults.nproc_per_node, defaults.derived_nproc),
                          defaults.accelerators, os.environ, work_root(), addr, iface, interfaces())


def read_history(is_control: bool, flow_name: str, run_id: str, step_name: str, previous: Optional[Previous],
                 mode: str, knobs: Knobs) -> Optional["History"]:
    """On the control, the node history read in the background from the task's start."""
    if not is_control or mode == modes.OFF:
        return None
    return History(flow_name, run_id, step_name, previous, knobs)


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


def job_plan(defaults: StepDefaults, calls_made: int) -> Optional[CallPlan]:
    """``preflight="full"``'s collective job, before the step's first call; None where it has no job to run."""
    if defaults.preflight != modes.FULL or calls_made:
        return None
    gpu = defaults.accelerators.kind == "gpu" and (cuda_devices(os.environ) or 0) > 0
    return plan_call(collective_check.preflight_job, {"backend": "nccl" if gpu else "gloo"}, None, None,
                     defaults, [os.getcwd()])


def job_lines(job: verdicts.JobRecord, history: Optional["History"], hosts: Dict[int, str]) -> List[str]:
    """What the control says of the job: its findings, and nodes slower than their host's own past."""
    seen = history.get() if history is not None else None
    found = [(node, node_history.slower_than_its_past(hosts.get(node, "?"), gbps, seen))
             for node, gbps in sorted(job.link_gbps.items())] if seen and hosts else []
    slower = ["node %d: %s" % (node, why) for node, why in found if why][:node_history.MAX_FLAGGED]
    return ["preflight: " + line for line in verdicts.describe_job(job) + slower]


@dataclass
class JobDeadlines:
    """The job's own deadlines, asked by its call (``CallRun.deadlines``). From when every rank
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
