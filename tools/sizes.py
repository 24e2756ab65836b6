"""Functions over 60 lines in the package, each needing a reason written
beside it (classes have no limit: a class is split by responsibility, never to
fit a line count, issue 51): a ``# size: <why>`` comment on its ``def`` or
``class`` line or the line above. Exits 1 naming those without one (make lint).

    python tools/sizes.py [--all]    # --all: list the justified ones too
"""

from __future__ import annotations

import ast
import os
import sys
from typing import Iterator, List, Tuple

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "metaflow_extensions")
LIMITS = {"function": 60}
MARK = "# size:"


def sized(tree: ast.AST) -> Iterator[Tuple[str, ast.AST]]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield "function", node


def reason(lines: List[str], node: ast.AST) -> str:
    """The ``# size:`` comment on the def/class line, among its decorators, or
    in the comment block just above them (it may run on over several lines)."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])  # type: ignore[attr-defined]
    above = first - 1
    while above >= 1 and lines[above - 1].lstrip().startswith("#"):
        above -= 1
    block = lines[above:node.lineno]  # type: ignore[attr-defined]
    for i, text in enumerate(block):
        if MARK in text:
            rest = [t.lstrip()[1:].strip() for t in block[i + 1:] if t.lstrip().startswith("#")]
            return " ".join([text.split(MARK, 1)[1].strip()] + rest)
    return ""


def report(root: str = ROOT) -> List[Tuple[str, str, int, str]]:
    found = []
    for top, _dirs, names in os.walk(root):
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            path = os.path.join(top, name)
            with open(path) as f:
                source = f.read()
            lines = source.splitlines()
            for kind, node in sized(ast.parse(source, path)):
                length = node.end_lineno - node.lineno + 1  # type: ignore[attr-defined]
                if length > LIMITS[kind]:
                    where = "%s:%d %s %s" % (os.path.relpath(path, os.path.dirname(root)), node.lineno, kind,
                                             node.name)  # type: ignore[attr-defined]
                    found.append((where, kind, length, reason(lines, node)))
    return found


def main(argv: List[str]) -> int:
    bad = 0
    for where, kind, length, why in report():
        if why and "--all" not in argv:
            continue
        print("%-80s %4d lines  %s" % (where, length, why or "NO REASON (limit %d)" % LIMITS[kind]))
        bad += not why
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
