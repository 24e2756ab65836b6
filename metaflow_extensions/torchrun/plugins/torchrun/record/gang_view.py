"""The gang as the control saw a call (``TorchrunResult.gang``): when each node joined and finished,
and its report. Apart from ``result.py``, which ``import metaflow`` loads: this record is written by
the codec, which loads with it at a call's end, not in every Metaflow process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Dict, Tuple

from ..base.codec import SKIP, Written

if TYPE_CHECKING:
    from ..gang import NodeReport
    from ..procs.status import RankStatus as RankRecord  # one rank's record (procs/status.py)


@dataclass(frozen=True)
class GangView(Written):
    """When each node joined and finished the call, and its report, as the control saw them."""

    @staticmethod
    def LATE_TYPES() -> Dict[str, Any]:  # noqa: N802  (the codec's name for it)
        from ..gang import NodeReport
        from ..procs.status import RankStatus

        return {"NodeReport": NodeReport, "RankRecord": RankStatus}

    joined_at: Dict[int, float] = field(default_factory=dict)
    finished_at: Dict[int, float] = field(default_factory=dict)
    reports: Dict[int, NodeReport] = field(default_factory=dict)
    # Each replaced start's ranks (0: the first start), of the nodes that reported its failure (gang/calls.py).
    replaced: Annotated[Dict[int, Dict[int, Tuple[RankRecord, ...]]], SKIP] = field(default_factory=dict)
