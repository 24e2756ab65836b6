"""What one node says of its share of a call: its own cause and its report to the
control, from what the ranks left in the work and log directories.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from typing import List, Optional

from ..cause import Cause, CauseKind
from ..errors import failure_summary
from ..gang.client import GangClient
from ..gang.messages import NodeReport
from ..gang.messages import MAX_RANKS_PER_NODE, STREAMS, TAIL_LINE_CHARS, TAIL_LINES
from ..host.logs import step_log_dir
from ..host.private import tail_lines
from ..procs.failures import RankFailure, describe_exit_code, with_last_output
from ..procs.names import rank_log_path
from ..record.result import read_rank_records
from .session import GangSession


def own_cause(node_index: int, call: int, exit_code: Optional[int], failures: List[RankFailure]) -> Cause:
    """The first of its ranks to fail, or torchrun's exit."""
    code = exit_code if exit_code is not None else -1
    if not failures:
        return Cause(CauseKind.RANK_FAILED, "node %d: torchrun ended with %s" % (node_index, describe_exit_code(code)),
                     node_index=node_index, exit_code=code, call=call)
    first = failures[0]
    return Cause(CauseKind.RANK_FAILED, failure_summary(first), node_index=node_index, rank=first.rank,
                 local_rank=first.local_rank, exit_code=code, exc_type=first.exc_type, message=first.message,
                 traceback=first.traceback[-16000:] or None, secondary=first.secondary, call=call)


def named(failure: RankFailure) -> RankFailure:
    """One name per node: torchrun's report names the host ``localhost``, a rank's own record its host name."""
    host = socket.gethostname()
    return failure if failure.host == host else dataclasses.replace(failure, host=host)


def completed(failure: RankFailure, log_dir: Optional[str]) -> RankFailure:
    """A failure without a traceback of its own, with the last lines its rank wrote."""
    if failure.traceback or not log_dir:
        return failure
    return with_last_output(failure, tail_lines(rank_log_path(log_dir, failure.rank, "stderr"), 200))


def report(workdir: str, log_dir: Optional[str], failures: List[RankFailure],
           started: Optional[float]) -> NodeReport:
    """What this node tells the control as it finishes: its ranks and their last lines, for the card."""
    ranks = read_rank_records(workdir, failures)
    tails = {}
    if log_dir:
        for rec in ranks:
            paths = {s: rank_log_path(log_dir, rec.rank, s) for s in STREAMS}
            tails[rec.rank] = {s: tuple(bounded_line(line) for line in tail_lines(p, TAIL_LINES))
                               for s, p in paths.items()}
    return NodeReport(ranks=tuple(r.for_wire() for r in ranks[:MAX_RANKS_PER_NODE]), tails=tails, started=started,
                      ended=time.time())


def bounded_line(line: str, limit: int = TAIL_LINE_CHARS) -> str:
    """A line of a rank's output as the gang carries it: at most ``limit`` characters,
    saying how many it had when cut (the control would cut it silently)."""
    if len(line) <= limit:
        return line
    note = "… [%d characters in all]" % len(line)
    return line[: max(0, limit - len(note))] + note


def failed_elsewhere(client: GangClient, call: int, node_index: int) -> List[int]:
    """The other nodes' failed ranks, from their reports (the control's: ``CallStacks.gather`` waited)."""
    return sorted(status.rank for node, report in client.call_view(call).reports.items()
                  if node != node_index for status in report.ranks if status.exit_code not in (0, None))


def any_rank_ran(workdir: Optional[str], failures: List[RankFailure], client: GangClient, call: int) -> bool:
    """Whether some rank of the call started, here or (the control) on another node."""
    if workdir and read_rank_records(workdir, failures):
        return True
    return any(report.ranks for report in client.call_view(call).reports.values())


def logs_line(session: GangSession, log_dir: Optional[str], ran: bool = True) -> str:
    """Where every rank's whole output is, and the card; the card alone where no rank ran."""
    if not log_dir:
        return ""
    if not ran:
        text = ""
    elif session.context.topology.is_local:
        text = "Every rank's output, whole: %s" % step_log_dir(log_dir)
    else:
        text = "This node's ranks' output, whole: %s on %s (each node's host keeps its own)" % (
            log_dir, socket.gethostname())
    card = session.card_line()
    return "%s\n%s" % (text, card) if text and card else text or card
