"""The records a call and the step's attempt leave behind (metadata, artifacts,
card, the next attempt): plain data and pure functions, built from what the
runtime hands in (``AttemptFacts``), never from a session, process or socket.
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
