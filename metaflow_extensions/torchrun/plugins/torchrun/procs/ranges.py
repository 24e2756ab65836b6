"""Sets of node or rank numbers as short text (``1, 4-9, 12``), one line however many."""

from __future__ import annotations

from typing import Iterable, List


def spans(items: Iterable[int]) -> List[str]:
    """Runs of three or more as a range, in order."""
    out: List[str] = []
    ordered = sorted(set(items))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        if j - i >= 2:
            out.append("%d-%d" % (ordered[i], ordered[j]))
        else:
            out.extend(str(v) for v in ordered[i:j + 1])
        i = j + 1
    return out


def numbers(items: Iterable[int], cap: int = 16) -> str:
    """At most ``cap`` pieces, then how many more."""
    pieces = spans(items)
    text = ", ".join(pieces[:cap])
    if len(pieces) > cap:
        text += " and %d more" % sum(_size(p) for p in pieces[cap:])
    return text


def _size(piece: str) -> int:
    low, _, high = piece.partition("-")
    return int(high) - int(low) + 1 if high else 1
