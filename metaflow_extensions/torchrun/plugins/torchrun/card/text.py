"""Text we did not write (a rank's output, a host name, an error), made safe
and bounded for the card's Markdown and HTML: escaped everywhere, a line cut
at ``CARD_LINE_CHARS`` and wrapping (no line can widen the page), a table cell
at ``CARD_CELL_CHARS``. Pure functions of text: the card's content
(``card/content.py``) and its sections use them.
"""

from __future__ import annotations

import html
import re
from typing import Any, List, Tuple

# A line of a rank's output, stack or error, at most, in the card (it wraps).
CARD_LINE_CHARS = 1000
# A table cell or heading holding text from a rank, at most; a run of more
# than BREAK_EVERY characters without a space gets a place to break.
CARD_CELL_CHARS = 200
BREAK_EVERY = 80
ZWSP = "\u200b"
# A preformatted block that wraps: a long line breaks instead of widening the
# page (inline style: the card's Markdown keeps raw HTML, and no CSS of ours
# reaches the card otherwise).
_PRE = '<pre style="white-space: pre-wrap; overflow-wrap: anywhere; word-break: break-word; margin: 0">'

# What the card's Markdown renderer (marked, drawn by svelte-markdown) does with
# text, measured in a real card (tests/integration/test_observability.py): a
# backslash escape is dropped with its character ("\\(x\\)" shows "x"), an
# entity shows as typed ("&lt;"), a code span drops its backticks; an HTML block
# is drawn as HTML, and a table cell as plain text. So text from a rank goes in a
# table cell as it is, in an HTML block escaped as HTML (``text_block``,
# ``html_line``), or in a code span (``escape_markdown``), never bare in Markdown.
_BACKTICK_LOOKALIKE = "\u02cb"
# Text that cannot be markup anywhere in a line (no emphasis, link, autolink,
# entity, HTML or escape character; starting with a letter or digit), shown as it is.
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9 .,;=+%()/-]*")


def escape_markdown(text: Any) -> str:
    """Text we did not write, inline in Markdown (a list item, a heading), as
    a code span: nothing in it is read as Markdown or HTML. Its fence is longer
    than any run of backticks in it; the renderer drops backticks inside a code
    span, so they are shown as a look-alike (U+02CB) rather than lost. Line
    breaks become spaces."""
    flat = " ".join(str(text).splitlines())
    if _PLAIN.fullmatch(flat) and "www." not in flat.lower():
        return flat  # a word or a version: nothing in it can be markup
    flat = flat.replace("`", _BACKTICK_LOOKALIKE)
    return "`` %s ``" % flat if flat.strip() else ""


def html_line(text: Any, limit: int = CARD_CELL_CHARS) -> str:
    """Text we did not write, for one line of an HTML block: cut (``clip``),
    breakable, HTML-escaped."""
    return html.escape(clip(text, limit))


def clip(text: Any, limit: int = CARD_CELL_CHARS) -> str:
    """Text we did not write as one line of at most ``limit`` characters (and a
    count of what was cut), for a table cell, a heading, a summary: where the
    browser can break it (``breakable``), so it wraps rather than widen the page."""
    flat = " ".join(str(text).splitlines())
    if len(flat) > limit:
        flat = "%s… [%d more characters]" % (flat[:limit], len(flat) - limit)
    return breakable(flat)


_RUN = re.compile(r"[^\s\u200b]{%d}" % BREAK_EVERY)


def breakable(text: str) -> str:
    """A zero-width space after every ``BREAK_EVERY`` characters without a
    space (a path, a long identifier): a line break opportunity, invisible."""
    return _RUN.sub(lambda m: m.group(0) + ZWSP, text)


def clip_lines(text: Any, total: int, line_limit: int = CARD_LINE_CHARS, keep: str = "head") -> Tuple[str, bool]:
    """Text we did not write, each line cut at ``line_limit`` characters and
    the whole at about ``total``: its first lines (``keep="head"``: a stack,
    innermost first) or its last (``"tail"``: output). True when anything was cut."""
    lines = str(text).splitlines()
    cut = False
    out = []
    for line in lines:
        if len(line) > line_limit:
            line = "%s… [%d more characters]" % (line[:line_limit], len(line) - line_limit)
            cut = True
        out.append(line)
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


def sentence(notes: List[str]) -> str:
    text = "; ".join(notes)
    return text[:1].upper() + text[1:]


def text_block(text: Any) -> str:
    """``text`` verbatim (HTML-escaped) in a preformatted block that wraps long
    lines, on one line of Markdown: its line breaks are written ``&#10;``, so the
    HTML block can neither end early (at a blank line) nor be split by the
    renderer (a carriage return), and a ``<details>`` around it holds it."""
    lines = str(text).splitlines()
    return "%s%s</pre>" % (_PRE, "&#10;".join(html.escape(line) for line in lines))


def code_block(text: Any) -> str:
    """``text`` verbatim in a fenced code block whose fence no line of it can
    close: longer than the longest run of backticks it holds."""
    body = str(text)
    longest = max((len(run) for run in re.findall("`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return "%s\n%s\n%s" % (fence, body, fence)
