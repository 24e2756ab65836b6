"""metaflow-torchrun 0.2, the older package this one replaces, installed beside it: both have the import
name ``metaflow_extensions.torchrun``, so Python would load parts of each. Named at ``import metaflow``,
before any flow runs; standard library only (this runs while Metaflow imports itself)."""

from __future__ import annotations

import os
from typing import Iterable, List, Optional, Tuple

# Files only 0.2 ships (outerbounds/metaflow-torchrun): its decorator module and helpers.
_02_FILES = ("torchrun_decorator.py", "torchrun_libs")
# Its metadata's folder, any case: metaflow_torchrun-0.2<anything but "-">.dist-info (or .egg-info). By
# hand, not a regular expression: compiling one cost every `import metaflow` as much as this whole check.
_DIST = "metaflow_torchrun-"
_INFO = (".dist-info", ".egg-info")
# Where pip installs nothing (and whose hundreds of names are most of this check's reading).
_STDLIB = (os.path.dirname(os.__file__), os.path.join(os.path.dirname(os.__file__), "lib-dynload"))


def _is_02_metadata(name: str) -> bool:
    low = name.lower()
    suffix = _INFO[0] if low.endswith(_INFO[0]) else _INFO[1] if low.endswith(_INFO[1]) else ""
    if not suffix or not low.startswith(_DIST):
        return False
    version = low[len(_DIST):-len(suffix)]
    major, dot, rest = version.partition(".")
    minor = rest[:len(rest) - len(rest.lstrip("0123456789"))]
    return "-" not in version and major.isdigit() and bool(minor) and (int(major), int(minor)) == (0, 2)


def _dist_version(directory: str) -> Optional[str]:
    """The 0.2.x version of a metaflow-torchrun install's metadata in ``directory`` (0.1.0 was ours)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    for name in names:
        if name[:len(_DIST)].lower() == _DIST and _is_02_metadata(name):  # the first test: most names, quickly
            return name.split("-")[1].rsplit(".", 1)[0].replace(".dist", "").replace(".egg", "")
    return None


def find_02_installs(paths: Iterable[str]) -> List[Tuple[str, str]]:
    """``(directory, version)`` of each sys.path entry that holds metaflow-torchrun 0.2."""
    found = []
    for path in paths:
        if not path or path in _STDLIB or not os.path.isdir(path):
            continue
        plugins = os.path.join(path, "metaflow_extensions", "torchrun", "plugins")
        has_files = any(os.path.exists(os.path.join(plugins, name)) for name in _02_FILES)
        version = _dist_version(path)
        if has_files or version:
            found.append((path, version or "0.2"))
    return found


def conflict_message(found: List[Tuple[str, str]], here: str) -> str:
    where = "; ".join("metaflow-torchrun %s in %s" % (version, path) for path, version in found)
    return (
        "metaflow-torchrun: the older package this one replaces is installed beside it (%s). "
        "Both use the import name metaflow_extensions.torchrun, so Metaflow would load parts of each. "
        "Remove it with `pip uninstall metaflow-torchrun` in that environment, then install this one "
        "(metaflow-torchrun 0.3, from %s): `pip install -e .` in a clone, or the wheel that "
        "`make dist` builds." % (where, here)
    )


class OldPackageInstalled(ImportError):
    """metaflow-torchrun 0.2 found on sys.path beside this package."""
