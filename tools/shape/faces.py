"""Which names each subpackage shows to the rest of the package: every import
that crosses into a subpackage from outside it, grouped by subpackage.

    python tools/shape/faces.py            # what crosses, and through what
    python tools/shape/faces.py --check    # exit 1 naming imports that bypass a face

An import bypasses a face when code outside ``gang/`` (say) imports
``gang.client`` rather than ``gang``: the face (``gang/__init__.py``) says what
the subpackage offers, and ``__all__`` lists it.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections import defaultdict
from typing import Dict, Iterator, List, Set, Tuple

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "metaflow_extensions", "torchrun", "plugins", "torchrun")
SUBPACKAGES = ("gang", "launch", "runtime", "card", "record", "procs", "host")


def modules() -> Iterator[Tuple[str, str]]:
    """(dotted name relative to the package, path) of every module."""
    for folder, _, files in os.walk(ROOT):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                yield (rel[: -len(".__init__")] if rel.endswith(".__init__") else rel), path


def resolve(module: str, is_package: bool, level: int, target: str) -> str:
    """The package-relative dotted name a relative import points at."""
    parts = module.split(".") if module else []
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([target] if target else []))


def crossings() -> List[Tuple[str, int, str, str, str]]:
    """(importing module, line, subpackage, imported module, name) for every
    import of a subpackage's module from outside that subpackage."""
    out = []
    for module, path in modules():
        is_package = path.endswith("__init__.py")
        own = module.split(".")[0] if "." in module or is_package else ""
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            target = resolve(module, is_package, node.level, node.module or "")
            top = target.split(".")[0]
            if top not in SUBPACKAGES or top == own:
                continue
            for alias in node.names:
                out.append((module, node.lineno, top, target, alias.name))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    rows = crossings()
    if args.check:
        bad = [r for r in rows if r[3] != r[2]]
        for module, line, _, target, name in bad:
            print("%s:%d imports %s from %s, not from its face %s" % (module, line, name, target, target.split(".")[0]))
        # A face's name that is also one of its modules' names: once that module is
        # loaded, Python hands out the module, not the name.
        clash = sorted({(top, name) for _, _, top, target, name in rows if target == top
                        and os.path.exists(os.path.join(ROOT, top, name + ".py"))
                        and name in getattr(__import__("metaflow_extensions.torchrun.plugins.torchrun." + top,
                                                       fromlist=["_HOME"]), "_HOME", {})})
        for top, name in clash:
            print("%s's face shows %s, which is also one of its modules" % (top, name))
        sys.exit(1 if bad or clash else 0)
    names: Dict[str, Set[str]] = defaultdict(set)
    through: Dict[str, Set[str]] = defaultdict(set)
    for _, _, top, target, name in rows:
        names[top].add(name)
        through[top].add(target)
    for top in SUBPACKAGES:
        print("%s: %d names through %d modules: %s" % (top, len(names[top]), len(through[top]),
                                                       ", ".join(sorted(names[top]))))


if __name__ == "__main__":
    main()
