"""The records a call and the step's attempt leave behind (metadata, artifacts,
card, the next attempt): plain data and pure functions, built from what the
runtime hands in (``AttemptFacts``), never from a session, process or socket.
"""

from __future__ import annotations

from ..base.lazy import names_from

TYPE_CHECKING = False

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

# Where each name lives: loaded on first use, so that `import metaflow` (which imports our
# decorator and exported classes) does not load the whole layer.
_MODULES = {
    "attempts": ("Previous",),
    "in_step_restarts": ("InStepRestart", "swap_words", "with_ranks_start"),
    "result": ("REPORT_ARTIFACT", "GangView", "TorchrunResult", "none_suspected", "read_rank_records", "suspected"),
    "step_record": ("AttemptFacts", "ThisAttempt", "keep_record", "meta_datum", "step_result"),
}

if TYPE_CHECKING:
    from .attempts import Previous
    from .in_step_restarts import InStepRestart, swap_words, with_ranks_start
    from .result import REPORT_ARTIFACT, GangView, TorchrunResult, none_suspected, read_rank_records, suspected
    from .step_record import AttemptFacts, ThisAttempt, keep_record, meta_datum, step_result

__getattr__ = names_from(__name__, {name: module for module, names in _MODULES.items() for name in names})
