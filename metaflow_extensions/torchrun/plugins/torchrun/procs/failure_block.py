"""The few lines a failed call shows, at most ``BUDGET`` whatever the gang's size (pure).

The root traceback once (user frames only), the echoes in one line, other
failures, the suspected culprit, where the stopped ranks were, the logs, the fix.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from ..base.text import first_line, shorten
from .failures import RankFailure
from .ranges import numbers
from .stacks import group

# gloo's and NCCL's "[/path/to/pair.cc:553] " in front of what happened.
_SOURCE = re.compile(r"^\[[^\]\s]+:\d+\]\s*")
BUDGET = 26  # lines of the block; Metaflow adds its own two around it
TRACEBACK_LINES = 12
OTHER_FAILURES = 2  # failures of their own kind named besides the root cause
PLACES = 5


@dataclass
class Block:
    root: Optional[RankFailure] = None
    others: Sequence[RankFailure] = ()
    stacks: Dict[int, str] = field(default_factory=dict)
    logs: str = ""  # where every rank's whole output is
    fix: str = ""
    headline: str = ""  # who failed first (with what, when no traceback says it)
    elsewhere: Sequence[int] = ()  # other nodes' ranks that failed after it: counted with the echoes
    suspects: Sequence[str] = ()


# Frames not the user's: this package's, runpy's and torch's launcher's.
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LAUNCHER = os.path.join("torch", "distributed", "elastic") + os.sep
CRASH_OUTPUT = "The rank's last lines of stderr"  # failures.with_last_output's heading
_DUMP_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line \d+ in ')


def is_users(filename: str) -> bool:
    if filename.startswith("<frozen runpy"):
        return False
    path = os.path.abspath(filename)
    return not (path.startswith(_OURS) or os.path.basename(path) == "runpy.py" or _LAUNCHER in path)


def traceback_lines(text: str, limit: int = TRACEBACK_LINES) -> List[str]:
    """The last ``limit`` lines; a crash's dump (innermost frame first) keeps its first, less our frames."""
    lines = (text or "").rstrip().splitlines()
    if lines and lines[0].startswith(CRASH_OUTPUT):
        lines = [line for line in lines if not ((m := _DUMP_FRAME.match(line)) and not is_users(m.group("file")))]
        if len(lines) <= limit:
            return lines
        return lines[:limit - 1] + ["... %d more lines in the rank's log" % (len(lines) - limit + 1)]
    if len(lines) <= limit:
        return lines
    return ["Traceback (most recent call last, %d lines above are in the rank's log):"
            % (len(lines) - limit + 1)] + lines[-(limit - 1):]


def echo_lines(others: Sequence[RankFailure], elsewhere: Sequence[int] = ()) -> List[str]:
    """The echoes in one line; a few other failures one line each, the rest counted."""
    echoes = [f for f in others if f.secondary]
    own = [f for f in others if not f.secondary]
    ranks = sorted({f.rank for f in echoes} | set(elsewhere) - {f.rank for f in own})
    out = []
    if ranks:
        kinds = sorted({first_line("%s: %s" % (f.exc_type, _SOURCE.sub("", f.message))) for f in echoes})
        more = " and %d other messages" % (len(kinds) - 1) if len(kinds) > 1 else ""
        what = " (%s%s)" % (shorten(kinds[0], 90), more) if kinds else ""
        out.append("%d other rank%s failed as echoes of it%s: %s; their tracebacks are in their logs"
                   % (len(ranks), "s" if len(ranks) != 1 else "", what,
                      "ranks " + numbers(ranks) if len(ranks) > 1 else "rank %d" % ranks[0]))
    for f in own[:OTHER_FAILURES]:
        out.append("Also failed: rank %d (node %d): %s" % (f.rank, f.node_index, shorten(
            first_line("%s: %s" % (f.exc_type, f.message)), 120)))
    if len(own) > OTHER_FAILURES:
        rest = own[OTHER_FAILURES:]
        out.append("Also failed: %d more ranks (%s)" % (len(rest), numbers(f.rank for f in rest)))
    return out


def place_lines(stacks: Dict[int, str], full: str, limit: int = PLACES) -> List[str]:
    if not stacks:
        return []
    groups = group(stacks)
    out = ["Where the other ranks were when stopped (every stack: %s):" % full]
    for place, ranks in groups[:limit]:
        label = "rank %d" % ranks[0] if len(ranks) == 1 else "ranks %s (%d)" % (numbers(ranks), len(ranks))
        out.append("  %s: %s" % (label, shorten(place[0], 140)))
    rest = groups[limit:]
    if rest:
        out.append("  ... and %d more places (%d ranks)" % (len(rest), sum(len(r) for _, r in rest)))
    return out


def render(block: Block, full: str = "the card") -> str:
    lines: List[str] = []
    if block.headline:
        lines.append(block.headline)
    if block.root is not None and block.root.traceback:
        lines.extend(traceback_lines(block.root.traceback))
    lines.extend(echo_lines(block.others, [r for r in block.elsewhere if block.root is None or r != block.root.rank]))
    stacks = {r: s for r, s in block.stacks.items() if block.root is None or r != block.root.rank}
    lines.extend(block.suspects)
    lines.extend(place_lines(stacks, full))
    if block.logs:
        lines.append(block.logs)
    if block.fix:
        lines.extend(block.fix.splitlines()[:3])
    return "\n".join(lines[:BUDGET])


