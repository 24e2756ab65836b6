"""One ``current.torch.run`` call on this node (``CallRun``), its parts composed once: enter (the
control announces the rendezvous port), prepare the first start (call_launch.py), run each start the
gang decides (restart_loop.py, each start by ranks_run.py), end well (call_success.py) or failed
(call_failure.py, the error chosen by call_error.py), and build the result (call_result.py), which the
error raised carries.
"""

from __future__ import annotations

import functools
import time
from typing import Optional

from ..cause import Cause, CauseKind
from ..errors import GangAborted
from ..launch import CallPlan
from ..record.result import TorchrunResult
from .call_error import CallOutcome, call_error, true_flag_hint
from .call_failure import NodeFailure
from .call_launch import NodeLaunch
from .call_result import CallEnd, CallParts, call_result
from .call_snapshots import CallSnapshots
from .call_stacks import CallStacks
from .call_success import finish_ok
from .preflight import JobDeadlines
from .ranks_run import RanksRun
from .restart_loop import RestartLoop
from .restarts import CallRestarts
from .session import GangSession


class CallRun:
    """One call on this node: its collaborators, each holding its own part of the call's state."""

    def __init__(self, session: GangSession, plan: CallPlan, index: int,
                 deadlines: Optional[JobDeadlines] = None) -> None:
        client = session.client
        assert client is not None, "a call runs in a joined gang"
        self.session = session
        self.client = client
        self.plan = plan
        self.index = index
        self.began = time.time()
        self.deadlines = deadlines  # the preflight job's own deadlines; None: a user's call
        context = session.context
        every = context.defaults.snapshot_every if deadlines is None else None  # none for the preflight's job
        snapshots = CallSnapshots(client, index, every, context.defaults.snapshot_memory,
                                  context.route[0] or "0.0.0.0", context.defaults.restarts, context.host_base)
        self.launch = NodeLaunch(session, plan, index, snapshots)  # what each start of the ranks is made of
        self.restarts = CallRestarts()  # the gang's in-step restarts of the ranks
        self.stacks = CallStacks()  # where the ranks were when the job was stopped
        self.ranks = RanksRun(session, client, index, self.launch, self.restarts, self.stacks, deadlines)
        self.failure = NodeFailure(session, client, plan, index, self.launch, self.ranks, self.stacks, deadlines)
        self.loop = RestartLoop(session, client, plan, index, self.launch, self.ranks, self.restarts, self.failure,
                                deadlines)
        self.rdzv_port: Optional[int] = None  # the call's, as the gang announced it (or the plan pinned it)

    def run(self) -> TorchrunResult:
        """The result, or the error (which carries it); kept by the session either way."""
        try:
            end = self.ended()
        except BaseException:  # told to stop (SIGTERM, Ctrl-C, @timeout), or ours: the record still kept
            self.result(CallEnd())
            raise
        result = self.result(end)
        if end.error is not None:
            raise end.error(result)
        return result

    def ended(self) -> CallEnd:
        """Enter, prepare, run each start, finish: how the call ended on this node."""
        client, index = self.client, self.index
        port = client.enter_call(index, self.plan.entry_name, self.launch.snapshots.open())
        if port is None:
            return CallEnd(error=self.aborted)
        self.rdzv_port = port if self.plan.rdzv_port is None else self.plan.rdzv_port  # pinned: every node has it
        last = self.loop.run(self.launch.prepare(client.seats.get((index, 0)), self.rdzv_port))
        if last.benched and (self.loop.departed or client.news.call_over(index)):
            # Sat the call out while the active nodes finished it, or told to go and the gang went on
            # without it: nothing of its own to report.
            return CallEnd()
        if self.loop.exit_code == 0 and self.session.cause is None:
            return finish_ok(client, self.plan, index, self.launch.workdir, self.failure.report(), self.aborted)
        return CallEnd(error=functools.partial(call_error, self.failure.outcome(last, self.loop.exit_code),
                                               true_keys=self.plan.true_keys))

    def result(self, end: CallEnd) -> TorchrunResult:
        """The call's result, whatever happened, kept by the session; the work directory removed."""
        try:
            parts = CallParts(self.session, self.plan, self.index, self.began, self.launch, self.ranks,
                              self.restarts, self.stacks)
            start = self.loop.start
            result = call_result(parts, start, start.rdzv_port if start is not None else self.rdzv_port,
                                 self.loop.exit_code, end, self.failure.failures)
            self.session.kept(result)
            return result
        finally:
            self.launch.release()

    def aborted(self, result: TorchrunResult) -> GangAborted:
        """The gang stopped around this node's ranks (before they started, or before every node was done)."""
        cause = self.session.cause or Cause(CauseKind.CONTROL_LOST, "the gang was stopped")
        topology = self.session.context.topology
        hint = true_flag_hint(CallOutcome(topology.node_index, cause), self.plan.true_keys)
        return GangAborted(topology.node_index, cause, same_log=topology.is_local, result=result, hint=hint)


def run_call(session: GangSession, plan: CallPlan) -> TorchrunResult:
    """One call, in the session's turn."""
    with session.in_call() as index:
        return CallRun(session, plan, index).run()
