"""Metaflow first, then us: imported for this effect, first, by every module that imports Metaflow at
its top (``errors.py``, ``decorator.py``, the card's and the records' that use Metaflow's cards or client).

``import metaflow`` imports our decorator, and through it most of this package. A user who imports one
of our modules first starts ``import metaflow`` half-way through that module's body; Metaflow then
reaches the half-made module and reports ``Cannot locate step_decorator plugin 'torchrun'``. So, when
Metaflow is not imported yet, our half-initialised modules are set aside while it imports: Metaflow
makes complete copies of them, which Python hands to the importer; the set-aside copies finish their
bodies (definitions only) unseen. Once Metaflow is imported this does nothing.
"""

from __future__ import annotations

import sys

_PACKAGE = __name__.rsplit(".", 1)[0] + "."


def metaflow_first() -> None:
    if "metaflow" in sys.modules:
        return
    halfway = {name: module for name, module in list(sys.modules.items())
               if name.startswith(_PACKAGE) and getattr(getattr(module, "__spec__", None), "_initializing", False)}
    for name in halfway:
        del sys.modules[name]
    try:
        import metaflow  # noqa: F401
    finally:
        for name, module in halfway.items():
            sys.modules.setdefault(name, module)


metaflow_first()
