"""Text we did not write (a rank's output, a host name, an error), made safe and bounded for the card:
escaped, lines cut and wrapping (none can widen the page), table cells cut.
"""

from __future__ import annotations

import html
import re
from typing import Any, List, Tuple

# A line of a rank's text; a table cell or heading; a run without a space gets a break after BREAK_EVERY.
CARD_LINE_CHARS = 1000
CARD_CELL_CHARS = 200
BREAK_EVERY = 80
ZWSP = "\u200b"
# A preformatted block that wraps (inline style: no CSS of ours reaches the card otherwise).
_PRE = '<pre style="white-space: pre-wrap; overflow-wrap: anywhere; word-break: break-word; margin: 0">'

# Metaflow's card lays its components out in a grid that widens to its longest unbroken word, and
# keeps a table's headers and a code block's lines unbroken: a host name, a metric or a check's name of a few hundred
# characters (the breaks written every BREAK_EVERY are too far apart for wide letters) pushed the
# page past the window (tests/unit/test_card_hostile.py). One style block, on each card once, lets
# any line break anywhere where it must; it changes nothing that fits.
WRAP_STYLE = ("<style>main p, main li, main td, main code, main summary, main h1, main h2 {overflow-wrap: anywhere}"
              " main th, main pre {white-space: pre-wrap !important; overflow-wrap: anywhere}</style>")

# The card's Markdown renderer, measured (tests/integration/test_observability.py), drops a backslash
# escape with its character, shows an entity as typed and drops a code span's backticks; it draws an HTML
# block as HTML and a table cell as plain text. So a rank's text goes in a cell as it is, in an HTML block
# escaped (``text_block``, ``html_line``) or in a code span (``escape_markdown``), never bare.
_BACKTICK_LOOKALIKE = "\u02cb"
# Text that cannot be markup anywhere in a line (no emphasis, link, autolink,
# entity, HTML or escape character; starting with a letter or digit), shown as it is.
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9 .,;=+%()/-]*")


def escape_markdown(text: Any) -> str:
    """Text we did not write, inline in Markdown, as a code span on one line; the renderer drops a code
    span's backticks, so they show as a look-alike (U+02CB) rather than vanish."""
    flat = " ".join(str(text).splitlines())
    if _PLAIN.fullmatch(flat) and "www." not in flat.lower():
        return flat  # a word or a version: nothing in it can be markup
    flat = flat.replace("`", _BACKTICK_LOOKALIKE)
    return "`` %s ``" % flat if flat.strip() else ""


def html_line(text: Any, limit: int = CARD_CELL_CHARS) -> str:
    """Text we did not write, for one line of an HTML block: clipped, then HTML-escaped."""
    return html.escape(clip(text, limit))


def clip(text: Any, limit: int = CARD_CELL_CHARS) -> str:
    """Text we did not write as one breakable line of at most ``limit`` characters (saying what was cut)."""
    flat = " ".join(str(text).splitlines())
    if len(flat) > limit:
        flat = "%s… [%d more characters]" % (flat[:limit], len(flat) - limit)
    return breakable(flat)


_RUN = re.compile(r"[^\s\u200b]{%d}" % BREAK_EVERY)


def breakable(text: str) -> str:
    """A zero-width space (an invisible break) in every ``BREAK_EVERY`` characters without a space."""
    return _RUN.sub(lambda m: m.group(0) + ZWSP, text)


def clip_lines(text: Any, total: int, line_limit: int = CARD_LINE_CHARS, keep: str = "head") -> Tuple[str, bool]:
    """Lines cut at ``line_limit``, the whole at about ``total``: its first lines (``keep="head"``, a
    stack) or its last (``"tail"``, output). True when anything was cut."""
    lines = str(text).splitlines()
    cut = any(len(line) > line_limit for line in lines)
    out = [line if len(line) <= line_limit else "%s… [%d more characters]" % (
        line[:line_limit], len(line) - line_limit) for line in lines]
    kept: List[str] = []
    size = 0
    for line in (out if keep == "head" else reversed(out)):
        size += len(line) + 1
        if size > total and kept:
            cut = True
            break
        kept.append(line)
    if keep != "head":
        kept.reverse()
    if len(kept) < len(out):
        note = "… [%d more lines]" % (len(out) - len(kept))
        kept = kept + [note] if keep == "head" else [note] + kept
    return "\n".join(kept), cut


def with_wrap_style(markdown: str) -> str:
    """``markdown`` (a paragraph of ours) and, after it, the card's one ``WRAP_STYLE``."""
    return "%s\n\n%s" % (markdown, WRAP_STYLE)


def sentence(notes: List[str]) -> str:
    text = "; ".join(notes)
    return text[:1].upper() + text[1:]


def text_block(text: Any) -> str:
    """``text`` HTML-escaped in a wrapping preformatted block on one line of Markdown (breaks written
    ``&#10;``), so a blank line cannot end the HTML block early and a ``<details>`` holds it."""
    lines = str(text).splitlines()
    return "%s%s</pre>" % (_PRE, "&#10;".join(html.escape(line) for line in lines))


def code_block(text: Any) -> str:
    """``text`` in a fenced code block whose fence is longer than any run of backticks in it."""
    body = str(text)
    longest = max((len(run) for run in re.findall("`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return "%s\n%s\n%s" % (fence, body, fence)
