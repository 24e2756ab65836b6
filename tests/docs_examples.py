"""Example code pasted into the docs, so that a page reads whole where Markdown is
shown unbuilt (a repository's web view), kept equal to its file in examples/,
which a test runs. A pasted example is a fenced code block right after the line
``<!-- example: examples/<dir>/<file> -->`` (an HTML comment: no renderer shows it).

    python tests/docs_examples.py --write    # copy each file into its pages again
"""

from __future__ import annotations

import os
import re
import sys
from typing import List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PASTED = re.compile(r"^<!-- example: (\S+) -->\n```(\w*)\n(.*?)^```$", re.M | re.S)


def pages() -> List[str]:
    docs = os.path.join(REPO, "docs")
    return [os.path.join(docs, n) for n in sorted(os.listdir(docs)) if n.endswith(".md")] + [
        os.path.join(REPO, "README.md")]


def pasted(markdown: str) -> List[Tuple[str, str]]:
    """(file, the code in the page) for every pasted example of a page."""
    return [(m.group(1), m.group(3)) for m in PASTED.finditer(markdown)]


def source(rel: str) -> str:
    with open(os.path.join(REPO, rel), encoding="utf-8") as f:
        return f.read()


def refreshed(markdown: str) -> str:
    return PASTED.sub(lambda m: "<!-- example: %s -->\n```%s\n%s```" % (m.group(1), m.group(2), source(m.group(1))),
                      markdown)


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    for page in pages():
        with open(page, encoding="utf-8") as f:
            text = f.read()
        if refreshed(text) != text:
            with open(page, "w", encoding="utf-8") as f:
                f.write(refreshed(text))
            print("refreshed", os.path.relpath(page, REPO))
