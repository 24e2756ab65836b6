"""The Python the docs give a reader: every ```python block of README.md and
docs/*.md, and every import written inline (`from x import y`).

Each block is run as written (tests/unit/test_docs_snippets.py), unless the line
right before it says why not, in an HTML comment no renderer shows:

    <!-- example: examples/<dir>/<file> -->    the file itself (docs_examples.py); its own test runs it
    <!-- not run: <the reason> -->              a fragment, or code that needs a GPU, a cluster or a past run

The reason is shown with the test's skip. Whether run or not, every import a
block or a page gives is imported, so an import path in the docs works as written.
"""

from __future__ import annotations

import ast
import glob
import os
import re
import textwrap
from dataclasses import dataclass
from typing import List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
# A fenced block, indented or not (inside a list item), with the line before it.
_BLOCK = re.compile(r"^(?P<before>[^\n]*)\n(?P<indent>[ \t]*)```python[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                    re.M | re.S)
_MARK = re.compile(r"<!-- (?:(?P<example>example: \S+)|not run: (?P<reason>[^>]+?)) -->\s*$")
_INLINE_IMPORT = re.compile(r"`((?:from [\w.]+ import [\w, ]+)|(?:import [\w.]+(?:, [\w.]+)*))`")


@dataclass(frozen=True)
class Snippet:
    page: str  # relative to the repository
    line: int  # of the opening fence
    code: str
    example: Optional[str] = None  # the examples/ file it is
    reason: Optional[str] = None  # why it is not run

    @property
    def name(self) -> str:
        return "%s:%d" % (self.page, self.line)


def snippets(pages: List[str] = PAGES) -> List[Snippet]:
    found = []
    for path in pages:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        page = os.path.relpath(path, REPO)
        for m in _BLOCK.finditer(text):
            mark = _MARK.search(m.group("before"))
            code = textwrap.dedent("".join(line[len(m.group("indent")):] if line.startswith(m.group("indent"))
                                           else line for line in m.group("body").splitlines(True)))
            found.append(Snippet(page, text.count("\n", 0, m.start("indent")) + 1, code,
                                 example=mark.group("example") if mark else None,
                                 reason=mark.group("reason") if mark else None))
    return found


def imports(code: str) -> List[str]:
    """The import statements of a block, as written; from its lines alone when
    the block is a fragment that does not parse."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return [line.split("#", 1)[0].strip() for line in code.splitlines()
                if re.match(r"\s*(from [\w.]+ import |import [\w.]+)", line)]
    return [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            and not (isinstance(node, ast.ImportFrom) and node.level)]


def inline_imports(pages: List[str] = PAGES) -> List[tuple]:
    """(page, statement) for every import written as inline code in prose."""
    found = []
    for path in pages:
        with open(path, encoding="utf-8") as f:
            text = _BLOCK.sub("", f.read())
        found += [(os.path.relpath(path, REPO), s) for s in _INLINE_IMPORT.findall(text)]
    return found
