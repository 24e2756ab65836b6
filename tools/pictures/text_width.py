"""How wide a line of SVG text draws, estimated without a browser: the pictures'
scripts wrap their text with it, and tests/docs_render.py checks every SVG in
docs/ with it. Widths are a sans-serif's (Helvetica/Arial metrics, rounded up), so
the estimate errs wide: a line it fits is not cut by a browser's own font. The
screenshots (tools/docs_screenshots.py) measure the real thing in Chromium.
"""

from __future__ import annotations

from typing import List

# Advance widths in ems, by character class; anything else counts as the widest
# lowercase letter.
_NARROW = set("ijl.,;:'!|`")  # 0.22-0.28 in Arial
_THIN = set("frtI()[]{}-/\\ \"*")  # 0.28-0.39
_WIDE = set("mwMW@%")  # 0.83-0.94
_UPPER_EM = 0.72
_DIGIT_EM = 0.56
_LOWER_EM = 0.56
BOLD = 1.08


def char_em(c: str) -> float:
    if c in _NARROW:
        return 0.28
    if c in _THIN:
        return 0.4
    if c in _WIDE:
        return 0.94
    if c.isupper():
        return _UPPER_EM
    if c.isdigit():
        return _DIGIT_EM
    return _LOWER_EM


def text_width(text: str, font_size: float, bold: bool = False) -> float:
    """The estimated advance of ``text`` in pixels at ``font_size``."""
    return sum(char_em(c) for c in text) * font_size * (BOLD if bold else 1.0)


def wrap(text: str, width: float, font_size: float, bold: bool = False) -> List[str]:
    """``text`` in lines of whole words that each fit ``width`` pixels."""
    lines: List[str] = []
    for word in text.split():
        if lines and text_width(lines[-1] + " " + word, font_size, bold) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines
