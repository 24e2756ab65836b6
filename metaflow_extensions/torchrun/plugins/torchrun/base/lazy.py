"""A face that loads each of its names on first use (PEP 562): the ranks import
``procs`` and ``host`` through theirs, and must not pull in the task's side."""

from __future__ import annotations

import importlib
import sys
TYPE_CHECKING = False  # typing unimported: a rank's stand-in loads this (procs/handoff.py)
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping


def names_from(package: str, home: Mapping[str, str]) -> Callable[[str], Any]:
    """The face's ``__getattr__``: a name from the module ``home`` gives for it."""

    def __getattr__(name: str) -> Any:
        if name in home:
            value = getattr(importlib.import_module("." + home[name], package), name)
            # Kept in the face: the next use is a plain attribute, not this call.
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError("module %r has no attribute %r" % (package, name))

    return __getattr__
