"""The control's word, in the run's datastore, that its gang's step ended fine.

A node lost mid-step that the gang went on without (a spare took its place, or ``min_nodes``) may
start again after the control's step is over: Kubernetes' Job re-creates a disrupted pod whenever it
gets one back, which can be long after. That task has no gang left to join. Failing would fail its
Job, and so the JobSet of a step that succeeded; so it reads this word as it starts, or once it finds
the control gone, and ends fine at once, saying why. The word sits beside the gang's secret
(``secret.py``), one per attempt, and holds nothing secret.
"""

from __future__ import annotations

import io
from typing import Optional

from .identity import GangIdentity
from .secret import Storage

_WORD = b"metaflow-torchrun: the gang's step ended fine\n"


def step_end_path(identity: GangIdentity) -> str:
    return "/".join((identity.flow_name, identity.run_id, identity.step_name, identity.control_task_id,
                     "torchrun-step-ended.%d" % identity.attempt))


class StepEnd:
    """One attempt's word: the control says it (``ended_fine``), a late node reads it (``ended``)."""

    def __init__(self, storage: Optional[Storage], identity: GangIdentity) -> None:
        self._storage = storage
        self._identity = identity

    def ended_fine(self) -> None:
        """The control, once every node left its step (before its service closes: a node that finds the
        service gone finds this word). Never raises: the step's outcome is decided."""
        if self._storage is None:
            return
        path = step_end_path(self._identity)
        try:
            self._storage.save_bytes(iter([(path, io.BytesIO(_WORD))]), overwrite=True)
        except Exception:  # a datastore error: a late node fails as it would without the word
            pass

    def ended(self) -> bool:
        """Whether the control's step already ended fine (False where it cannot be read)."""
        if self._storage is None:
            return False
        try:
            with self._storage.load_bytes([step_end_path(self._identity)]) as loaded:
                for _, local_path, _ in loaded:
                    if local_path is None:
                        return False
                    with open(local_path, "rb") as f:
                        return f.read(len(_WORD) + 1) == _WORD
        except Exception:  # a transient datastore error: not known to have ended
            return False
        return False
