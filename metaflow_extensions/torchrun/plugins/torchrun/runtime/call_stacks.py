"""Where the ranks of one call were when its job was stopped: each node's stacks and
Flight Recorders, collected before its ranks stop and sent at once (even none); the
control gathers them within ``STACKS_WAIT``, not waiting for a lost node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..base import timeouts
from ..cause import CONTROL_GONE, Cause, CauseKind
from ..gang.client import GangClient
from ..host import log
from ..procs.culprit import Culprits, find_culprits, unread_reason
from ..procs.flight import FlightSummary
from ..procs import flight_ask, stacks
from ..record.result import read_rank_records, suspected
from .supervisor import Supervisor

_log = log.get("runtime.call_stacks")


@dataclass
class CallStacks:
    stacks: Dict[int, str] = field(default_factory=dict)  # rank -> faulthandler's dump
    seconds: float = 0.0  # what collecting (and gathering) them took
    shared: bool = False
    nodes: Dict[int, int] = field(default_factory=dict)  # rank -> its node, for the ranks seen
    culprits: Optional[Culprits] = None  # the control's suspects, for the record and the card
    flights: Dict[int, FlightSummary] = field(default_factory=dict)  # rank -> its Flight Recorder's summary
    flight_unread: str = ""  # no suspect named: why the Flight Recorders could not say (bounded)

    def collect(self, client: GangClient, index: int, supervisor: Optional[Supervisor], workdir: str) -> None:
        """Before the supervisor stops the ranks: each live rank's stacks and Flight Recorder."""
        if supervisor is None or not workdir:
            return
        began = time.monotonic()
        live = supervisor.live_pids()
        pids = {r.rank: r.pid for r in read_rank_records(workdir, [])
                if r.end is None and isinstance(r.pid, int) and r.pid in live}
        # Both at once: the recorders answer while faulthandler writes.
        asked = flight_ask.ask(workdir, sorted(pids))
        self.stacks = stacks.collect(workdir, pids)
        self.flights = asked.answers(began + timeouts.COLLECT_SECONDS)
        self.seconds += time.monotonic() - began
        _log.debug("call %d: of %d live ranks, %d stacks and %d of %d Flight Recorders collected in %.3fs", index,
                   len(pids), len(self.stacks), len(self.flights), len(asked.asked), self.seconds)
        self.share(client, index, entered=True)  # at once: the control waits only so long
        # In the gang's stop, the ranks live until every node has collected its own (a peer's
        # ranks in a collective with these would die before their node asked).
        if client.cause is not None and client.cause.kind not in CONTROL_GONE:
            client.news.wait_stacks_in(index, max(0.0, began + timeouts.STACKS_WAIT - time.monotonic()))

    def share(self, client: GangClient, index: int, entered: bool) -> None:
        """Once per failed call entered, even empty (the control waits for every node's)."""
        if self.shared or not entered:
            return
        self.shared = True
        client.send_stacks(index, self.stacks, self.flights)

    def gather(self, client: GangClient, index: int, node_index: int) -> None:
        """The control: every node's stacks and reports, as long as allowed."""
        if not client.speaks_for_gang:
            return
        began = time.monotonic()
        budget = max(0.0, timeouts.STACKS_WAIT - self.seconds)  # collecting our own counts too
        cause = client.cause
        silent = {cause.node_index, *cause.missing} if cause is not None and cause.kind in (
            CauseKind.NODE_LOST, CauseKind.UNRESPONSIVE) else set()
        while True:
            waited = time.monotonic() - began
            pending = client.pending(index, stacks=waited < budget, reports=waited < timeouts.REPORTS_WAIT)
            if not pending - silent:
                break
            time.sleep(0.02)
        view = client.call_view(index)
        for node, by_rank in [*view.stacks.items(), *view.flights.items()]:
            self.nodes.update(dict.fromkeys(by_rank, node))
        for node, report in view.reports.items():
            self.nodes.update((r.rank, node) for r in report.ranks if r.rank >= 0)
        self.nodes.update(dict.fromkeys([*self.stacks, *self.flights], node_index))
        self.stacks = {**{r: s for got in view.stacks.values() for r, s in got.items()}, **self.stacks}  # ours uncut
        self.flights = {**{r: f for got in view.flights.values() for r, f in got.items()}, **self.flights}
        self.seconds += time.monotonic() - began
        _log.debug("call %d: every node's stacks and reports gathered in %.3fs", index, time.monotonic() - began)

    def suspects(self, client: GangClient, cause: Cause) -> List[str]:
        """The control, after ``gather``: the ranks not in the collective the others wait in
        (procs/culprit.py), said unless a failed rank is the root cause. Not on a worker:
        its own ranks' alone would mislead."""
        if not client.speaks_for_gang or not (self.stacks or self.flights):
            return []
        found = find_culprits(self.stacks, self.nodes, client.hosts(), tuple(self.nodes), flights=self.flights)
        if found is None:
            self.flight_unread = unread_reason(self.flights)
            return []
        self.culprits = found
        return suspected(found, cause)
