"""The records: what a call and the step's attempt leave behind, for the
Metaflow metadata, the artifacts, the card and the next attempt.

A call's result (``TorchrunResult``), its in-step restarts, the step's record
(every attempt so far, with its nodes, roles and goodput ledger), the node
history read back from earlier runs, a failed attempt's evidence and what ran.
Plain data and pure functions of it: nothing here runs a process or opens a
socket, and nothing reads the session; the runtime hands in what it knows
(``AttemptFacts``). Modules with many functions of one concern (``attempts``,
``goodput``, ``node_history``, ``evidence``, ``what_ran``) are imported as
modules: ``from ..record import goodput``.
"""

from __future__ import annotations

from .attempts import Previous
from .in_step_restarts import InStepRestart, swap_words, with_ranks_start
from .result import REPORT_ARTIFACT, GangView, TorchrunResult, none_suspected, read_rank_records, suspected
from .step_record import AttemptFacts, ThisAttempt, keep_record, meta_datum, step_result

__all__ = [
    "AttemptFacts",
    "GangView",
    "InStepRestart",
    "Previous",
    "REPORT_ARTIFACT",
    "ThisAttempt",
    "TorchrunResult",
    "keep_record",
    "meta_datum",
    "none_suspected",
    "read_rank_records",
    "step_result",
    "suspected",
    "swap_words",
    "with_ranks_start",
]
