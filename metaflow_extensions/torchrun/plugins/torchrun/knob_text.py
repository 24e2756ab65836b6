"""What the text of a ``METAFLOW_TORCHRUN_*`` knob means, in one place.

Every reader of a knob parses it with these functions, and the step's start runs
the same readers strictly (``runtime/knob_check.py``): a value a reader could only
misread (a word where a number is due, a negative count, a typo for "off") stops
the step naming the knob and what it takes, instead of quietly becoming the
default. Read leniently, as the readers do where no one could be told (a rank, a
prune in the background), such a value is the default. At the bottom of the
layers: it imports nothing of the package.
"""

from __future__ import annotations

import math
from typing import Optional

# The words for "off" (and "on") a knob takes, the same for every knob.
OFF_WORDS = ("off", "false", "no", "none")
ON_WORDS = ("1", "true", "yes", "on")


class KnobError(ValueError):
    """A knob's value, named, with what the knob takes."""


def is_off(text: Optional[str]) -> bool:
    return (text or "").strip().lower() in OFF_WORDS


def is_on(text: Optional[str]) -> bool:
    return (text or "").strip().lower() in ON_WORDS


def says_off(text: Optional[str]) -> bool:
    """Off as a switch reads it: ``OFF_WORDS``, 0, or nothing at all."""
    return is_off(text) or (text or "").strip() in ("0", "")


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "...")


def number(name: str, text: Optional[str], default: float, low: float = 0.0, above: bool = False,
           whole: bool = False, strict: bool = False) -> float:
    """``text`` as a number of at least ``low`` (more than ``low`` where
    ``above``), a whole one where ``whole``; ``default`` where unset or blank."""
    if text is None or not str(text).strip():
        return default
    raw = str(text).strip()
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    readable = math.isfinite(value) and (not whole or value == int(value))
    if not (readable and (value > low if above else value >= low)):
        if strict:
            raise KnobError("%s=%s: give %s %s %g" % (
                name, _shown(raw), "a whole number" if whole else "a number", "above" if above else "of at least", low))
        return default
    return int(value) if whole else value


def count_or_off(name: str, text: Optional[str], default: int, strict: bool = False) -> int:
    """A whole number of at least 0, or "off" (0)."""
    if is_off(text):
        return 0
    try:
        return int(number(name, text, default, whole=True, strict=True))
    except KnobError:
        if strict:
            raise KnobError("%s=%s: give a whole number of at least 0, or off" % (name, _shown(str(text).strip())))
        return default


def switch(name: str, text: Optional[str], strict: bool = False) -> bool:
    """On (``ON_WORDS``) or off (unset, blank, 0 or ``OFF_WORDS``)."""
    if is_on(text):
        return True
    if strict and not says_off(text):
        raise KnobError("%s=%s: give 1 (or true, yes, on) or 0 (or false, no, off)" % (
            name, _shown((text or "").strip().lower())))
    return False
