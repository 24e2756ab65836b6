"""What each subpackage's face (its ``__init__``) shows, and what the rest of
the package imports from it.

    python tools/shape/faces.py            # each face's names, who uses them, what is imported by path
    python tools/shape/faces.py --check    # exit 1 naming a face that is wider or lazier than it should be

A face lists the names most callers outside the subpackage use, once, in
``__all__``; anything else a caller needs it imports from the defining module by
its path (``from ..gang.bench import Seat``, or the module itself:
``from ..gang import messages``). The check refuses:

- a name imported from a face that its ``__all__`` does not list;
- a face whose ``__all__`` hands out one of its modules (a module re-exported
  wholesale: callers import it by its path);
- a narrow face (``NARROW``) over ``MAX_NAMES`` names, or showing a name that no
  module outside the subpackage imports from it.

Every face loads its names lazily (``base/lazy.py``): the ranks import ``procs``
and ``host`` through theirs, and ``import metaflow`` (every Metaflow process)
imports our decorator and exported classes, which must not load the layers a
step enters only when it uses ``@torchrun``.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections import defaultdict
from typing import Dict, Iterator, List, Set, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT = os.path.join(REPO, "metaflow_extensions", "torchrun", "plugins", "torchrun")
PACKAGE = "metaflow_extensions.torchrun.plugins.torchrun"
# Callers outside the package: their absolute imports count as the package's own.
OUTSIDE = ("tests", "benchmarks", "tools")
SUBPACKAGES = ("gang", "launch", "runtime", "card", "record", "procs", "host")
# Faces only the task side imports: at most MAX_NAMES names.
NARROW = ("gang", "launch", "runtime", "card", "record")
MAX_NAMES = 15


def modules() -> Iterator[Tuple[str, str]]:
    """(dotted name relative to the package, path) of every module; a module
    of the tests, benchmarks or tools is named by its path from the repository."""
    for top in (ROOT,) + tuple(os.path.join(REPO, d) for d in OUTSIDE):
        for folder, _, files in os.walk(top):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    if top != ROOT:
                        yield os.path.relpath(path, REPO), path
                        continue
                    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    yield (rel[: -len(".__init__")] if rel.endswith(".__init__") else rel), path


def resolve(module: str, is_package: bool, level: int, target: str) -> str:
    """The package-relative dotted name a relative import points at."""
    parts = module.split(".") if module else []
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([target] if target else []))


def is_module(top: str, name: str) -> bool:
    """Whether ``name`` is one of subpackage ``top``'s modules."""
    return os.path.exists(os.path.join(ROOT, top, name + ".py")) or os.path.isdir(os.path.join(ROOT, top, name))


def crossings() -> List[Tuple[str, int, str, str, str]]:
    """(importing module, line, subpackage, imported module, name) for every
    import of a subpackage from outside it (the tests, benchmarks and tools
    included); a module imported from the face
    (``from ..gang import messages``) is counted as imported by its path."""
    out = []
    for module, path in modules():
        is_package = path.endswith("__init__.py")
        own = module.split(".")[0] if ("." in module or is_package) and not module.endswith(".py") else ""
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                target = resolve(module, is_package, node.level, node.module or "")
            elif (node.module or "").startswith(PACKAGE + "."):
                target = (node.module or "")[len(PACKAGE) + 1:]
            else:
                continue
            top = target.split(".")[0]
            if top not in SUBPACKAGES or top == own:
                continue
            for alias in node.names:
                if target == top and is_module(top, alias.name):
                    out.append((module, node.lineno, top, top + "." + alias.name, "*"))
                else:
                    out.append((module, node.lineno, top, target, alias.name))
    return out


def face(top: str) -> Tuple[List[str], bool]:
    """The names a face's ``__all__`` lists, and whether it loads them lazily."""
    with open(os.path.join(ROOT, top, "__init__.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    shown: List[str] = []
    lazy = False
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if "__all__" in targets and isinstance(node.value, (ast.List, ast.Tuple)):
                shown = [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            lazy = lazy or "__getattr__" in targets
    return shown, lazy


def problems(rows: List[Tuple[str, int, str, str, str]]) -> List[str]:
    """Each import or face that breaks the rules in this module's docstring."""
    out = []
    used: Dict[str, Set[str]] = defaultdict(set)
    for module, line, top, target, name in rows:
        if target != top:
            continue
        used[top].add(name)
        if name not in face(top)[0]:
            out.append("%s:%d imports %s from %s's face, which does not show it: import it from its module"
                       % (module, line, name, top))
    for top in SUBPACKAGES:
        shown, lazy = face(top)
        for name in shown:
            if is_module(top, name):
                out.append("%s's face shows its module %s: callers import it by its path" % (top, name))
        if top not in NARROW:
            continue
        if len(shown) > MAX_NAMES:
            out.append("%s's face shows %d names (at most %d): the rest by their modules' path"
                       % (top, len(shown), MAX_NAMES))
        if not lazy:
            out.append("%s's face loads eagerly: `import metaflow` would load the whole subpackage" % top)
        for name in sorted(set(shown) - used[top]):
            out.append("%s's face shows %s, which no module outside %s imports from it" % (top, name, top))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    rows = crossings()
    if args.check:
        bad = problems(rows)
        print("\n".join(bad)) if bad else None
        sys.exit(1 if bad else 0)
    users: Dict[str, Set[str]] = defaultdict(set)
    by_path: Dict[str, Set[str]] = defaultdict(set)
    for module, _, top, target, _ in rows:
        (users if target == top else by_path)[top].add(module if target == top else target[len(top) + 1:])
    for top in SUBPACKAGES:
        shown, lazy = face(top)
        print("%s: %d names%s, imported by %d modules: %s" % (top, len(shown), " (lazy)" if lazy else "",
                                                              len(users[top]), ", ".join(sorted(shown))))
        print("  modules imported by path: %s" % ", ".join(sorted(by_path[top])))


if __name__ == "__main__":
    main()
