"""docs/design.md's module table is the map of the package: every module has its
row, and every row names a module that exists."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "metaflow_extensions", "torchrun", "plugins", "torchrun")
ROW = re.compile(r"^\| `([a-z_/]+\.py)` \|", re.M)


def package_modules():
    found = set()
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py") and name != "__init__.py":
                found.add(os.path.relpath(os.path.join(folder, name), PACKAGE).replace(os.sep, "/"))
    return found


def table_rows():
    with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as f:
        return set(ROW.findall(f.read()))


def test_every_module_has_a_row_in_the_design_map():
    missing = sorted(package_modules() - table_rows())
    assert not missing, "docs/design.md's module table lacks: %s" % ", ".join(missing)


def test_every_row_of_the_design_map_is_a_module():
    stale = sorted(table_rows() - package_modules())
    assert not stale, "docs/design.md's module table names modules that do not exist: %s" % ", ".join(stale)


def test_the_timings_table_lists_every_fixed_time():
    from metaflow_extensions.torchrun.plugins.torchrun.base import timeouts

    with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as f:
        text = f.read()
    table = text[text.index("## Timings"):text.index("## One home for every name")]
    listed = set(re.findall(r"^\| `([A-Z_]+)` \|", table, re.M))
    defined = {name for name in vars(timeouts) if name.isupper()}
    assert listed == defined, (sorted(defined - listed), sorted(listed - defined))
