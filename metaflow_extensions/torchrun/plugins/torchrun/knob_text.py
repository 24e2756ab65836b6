"""The lenient readers ``record/node_history.py``'s ``parse_threshold`` and
``history_runs`` still use; nothing else does. The settings are read once, at
the step's start, into ``knobs.Knobs``: this module goes with those two."""

from __future__ import annotations

from typing import Optional

from .knobs import KnobError, says_off
from .knobs import number as _number

__all__ = ["KnobError", "number", "says_off"]


def number(name: str, text: Optional[str], default: float, low: float = 0.0, above: bool = False,
           whole: bool = False, strict: bool = False) -> float:
    """``knobs.number``, with ``default`` where unset or blank, or (unless ``strict``) misread."""
    if text is None or not str(text).strip():
        return default
    try:
        return _number(name, str(text), low, above=above, whole=whole)
    except KnobError:
        if strict:
            raise
        return default
