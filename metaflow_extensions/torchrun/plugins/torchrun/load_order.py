"""Metaflow first, then us: imported (for this effect) by the two modules that
import Metaflow at their top, ``errors.py`` and ``decorator.py``.

Why. ``import metaflow`` imports every extension's step decorators while it
initialises (``metaflow/plugins/__init__.py``), so it imports ``decorator.py``
and, through it, most of this package. When a user imports one of our modules
first (``from ...plugins.torchrun.errors import TorchrunFailed``), that module
starts ``import metaflow`` half-way through its own body; Metaflow's import of
``decorator.py`` then reaches the half-made module, fails with "cannot import
name ... partially initialized module (most likely due to a circular import)",
and Metaflow reports it as ``Cannot locate step_decorator plugin 'torchrun'``.

What. When Metaflow is not imported yet, the modules of this package that are
still initialising are set aside while Metaflow imports: Metaflow then makes
its own complete copies of them, and Python hands those to the importer (it
returns what ``sys.modules`` holds once a module's body ends). The set-aside
copies finish their bodies unseen (definitions only: no module here does more
at import, and ``register_lint_check`` is idempotent). Once Metaflow is
imported this does nothing: the usual order, Metaflow first, is untouched.
Ranks never import this (``procs/`` and ``host/`` import no Metaflow).
"""

from __future__ import annotations

import sys

_PACKAGE = __name__.rsplit(".", 1)[0] + "."


def _initialising() -> dict:
    return {
        name: module
        for name, module in list(sys.modules.items())
        if name.startswith(_PACKAGE) and getattr(getattr(module, "__spec__", None), "_initializing", False)
    }


def metaflow_first() -> None:
    if "metaflow" in sys.modules:
        return
    halfway = _initialising()
    for name in halfway:
        del sys.modules[name]
    try:
        import metaflow  # noqa: F401
    finally:
        for name, module in halfway.items():
            sys.modules.setdefault(name, module)


metaflow_first()
