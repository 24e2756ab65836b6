"""The console messages the docs quote, and whether real output still says them.

A quote is an inline code span, or a line of a ```console block, that reads as one of
our messages (the patterns below). In a quote, ``...`` stands for any text, a number
for any number and a 'quoted name' for any quoted name, so a doc may quote a
message from another run than the test's. Anything else in the docs is not a quote:
write prose, or quote a message a test produces (tests/integration/test_docs_quotes.py).
"""

from __future__ import annotations

import glob
import os
import re
from typing import Dict, List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs")
# Pages other branches own are checked once they are merged; the README is a doc too.
SOURCES = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(DOCS, "*.md")))

MESSAGE = re.compile(
    r"^(@torchrun: |\[rank\d+\]: |(node|call|rank) \d+ (ended|differs|did|stopped|of|failed|exited)|"
    r"the step received SIGTERM|Fix: )"
)
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
_SPAN = re.compile(r"`([^`]+)`")


def quoted_messages(paths: List[str] = SOURCES) -> List[Tuple[str, str]]:
    """``(page, quote)`` for every console message the docs quote."""
    found = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        page = os.path.relpath(path, REPO)
        for lang, body in _FENCE.findall(text):
            if lang == "console":
                found += [(page, line.strip()) for line in body.splitlines() if line.strip()]
        prose = _FENCE.sub("", text)
        spans = [" ".join(span.split()) for span in _SPAN.findall(prose)]
        found += [(page, span) for span in spans if MESSAGE.match(span)]
    return found


def _pattern(quote: str) -> "re.Pattern[str]":
    parts = re.split(r"(\.\.\.|'[^']*'|\d+(?:\.\d+)?)", " ".join(quote.split()))
    out = []
    for part in parts:
        if part == "...":
            out.append(".*?")
        elif re.fullmatch(r"'[^']*'", part):
            out.append("'[^']*'")
        elif re.fullmatch(r"\d+(?:\.\d+)?", part):
            out.append(r"\d+(?:\.\d+)?")
        else:
            out.append(re.escape(part))
    return re.compile("".join(out))


_TASK_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ (\[[^\]]*\] ?)?", re.M)


def unmatched(quotes: List[Tuple[str, str]], output: str) -> List[Tuple[str, str]]:
    """The quotes that no line of ``output`` (Metaflow's prefixes removed) says."""
    lines = [" ".join(line.split()) for line in _TASK_PREFIX.sub("", output).splitlines()]
    text = "\n".join(lines)
    return [(page, q) for page, q in quotes if not _pattern(q).search(text)]


def by_page(quotes: List[Tuple[str, str]]) -> Dict[str, List[str]]:
    pages: Dict[str, List[str]] = {}
    for page, quote in quotes:
        pages.setdefault(page, []).append(quote)
    return pages


# The card command a control prints ("The card: ..." in a failure, "this step's card: ..."
# on success) names its attempt's card by its hash: one card per attempt.
_PRINTED_CARD = re.compile(r"(The card|this step's card): python \S+ card view \S+ --id torchrun(?P<rest>.*)")


def card_commands_without_hash(paths: List[str] = SOURCES) -> List[Tuple[str, str]]:
    """``(page, line)`` for every line that shows the card command as the
    control prints it, but without ``--hash`` (a capture from before one card
    per attempt)."""
    found = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                printed = _PRINTED_CARD.search(line)
                if printed and "--hash" not in printed.group("rest"):
                    found.append((os.path.relpath(path, REPO), line.strip()))
    return found
