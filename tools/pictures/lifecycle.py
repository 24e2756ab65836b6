"""Draws docs/lifecycle.svg: a gang's life on a time axis (nodes joining, a call, a
failure, the stop). Plain SVG written by hand, so it needs nothing installed:
`python tools/pictures/lifecycle.py docs/lifecycle.svg` (make pictures)."""

from __future__ import annotations

import os
import sys
from typing import List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from text_width import wrap  # noqa: E402

W, ROW, LEFT, TOP = 760, 54, 130, 40
NOTE_SIZE, NOTE_LINE = 12, 16
CAPTION = (
    "green: the node joins the gang service as its step starts; light: the step; dark: the call "
    "(torchrun and its ranks); node 1's rank fails, the control stops every node."
)
# (label, joined at, call starts, call ends, how the node ends) in seconds of a made-up run.
NODES = [
    ("node 0 (control)", 0.0, 3.0, 9.0, "stopped"),
    ("node 1", 1.2, 3.0, 8.0, "failed"),
    ("node 2", 2.4, 3.0, 9.0, "stopped"),
]
END = 11.0


def x(t: float) -> float:
    return LEFT + (W - LEFT - 20) * t / END


def _node(i: int, label: str, joined: float, start: float, end: float, how: str) -> List[str]:
    y = TOP + i * ROW
    out = [
        '<text x="8" y="%d" class="label">%s</text>' % (y + 20, label),
        '<rect x="%.0f" y="%d" width="%.0f" height="28" class="step"/>' % (x(joined), y + 2, x(end + 0.6) - x(joined)),
        '<rect x="%.0f" y="%d" width="%.0f" height="28" class="call"/>' % (x(start), y + 2, x(end) - x(start)),
        '<circle cx="%.0f" cy="%d" r="5" class="join"/>' % (x(joined), y + 16),
    ]
    mark = "fail" if how == "failed" else "stop"
    out.append('<text x="%.0f" y="%d" class="%s">%s</text>' % (x(end) + 4, y + 21, mark, "x failed" if how == "failed" else "stopped"))
    return out


def svg() -> str:
    caption = wrap(CAPTION, W - 16, NOTE_SIZE)  # fitted to the picture, never cut at its edge
    base = TOP + len(NODES) * ROW + 6
    height = base + 22 + NOTE_LINE * len(caption) + 8
    parts = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
        'font-family="sans-serif" font-size="13">' % (W, height, W, height),
        "<style>.label{fill:#222}.step{fill:#dde7f3}.call{fill:#4a7fc1}.join{fill:#2a9d3a}"
        ".fail{fill:#c0392b;font-weight:bold}.stop{fill:#777}.axis{stroke:#999}"
        ".note{fill:#555;font-size:%dpx}</style>" % NOTE_SIZE,
        '<text x="8" y="22" font-weight="bold">A gang\'s life: join, one call of current.torch.run, a failure, the stop</text>',
    ]
    for i, node in enumerate(NODES):
        parts += _node(i, *node)
    parts.append('<line x1="%d" y1="%d" x2="%d" y2="%d" class="axis"/>' % (LEFT, base, W - 20, base))
    for t in range(0, int(END) + 1, 2):
        parts.append('<text x="%.0f" y="%d" class="note">%d s</text>' % (x(t) - 6, base + 16, t))
    for i, line in enumerate(caption):
        parts.append('<text x="8" y="%d" class="note">%s</text>' % (base + 38 + NOTE_LINE * i, line))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    with open(sys.argv[1] if len(sys.argv) > 1 else "docs/lifecycle.svg", "w") as f:
        f.write(svg())
