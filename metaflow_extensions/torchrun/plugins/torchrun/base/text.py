"""Text shortened for a person, the one way (pure): cut where a word ends and
marked with ``…``, since a word cut in two reads as another ("caused by a r…").
"""

from __future__ import annotations

ELLIPSIS = "…"


def shorten(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, ending in ``…`` when cut."""
    if len(text) <= limit:
        return text
    if limit <= len(ELLIPSIS):
        return text[:limit]
    head = text[: limit - len(ELLIPSIS)]
    if not text[len(head)].isspace():  # inside a word: back to its start, unless over half back (a path)
        space = max(head.rfind(" "), head.rfind("\t"))
        if space >= len(head) // 2:
            head = head[:space]
    return head.rstrip(" \t,;:") + ELLIPSIS


def first_line(text: str) -> str:
    """A message's headline: its first line, after any leading blank ones."""
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else ""


def count(number: int, noun: str, plural: str = "") -> str:
    """``1 run``, ``3 runs``: a count with its noun as a person writes it."""
    return "%d %s" % (number, noun if number == 1 else plural or noun + "s")
