"""The @torchrun implementation. Its rooms, top to bottom (each may import only those below it,
as import-linter holds): ``decorator`` and ``cli``; ``handle``, ``compat``, ``lint``, ``spec``;
``runtime``; ``card``; ``record``; ``launch``; ``gang``; ``errors``; ``cause``; ``procs``; ``host``;
``base``. Each room's ``__init__`` says what it holds.

The one lazy boundary is here: every rank's start imports ``procs`` through this package, with no
Metaflow, so the public names load on first use.
"""

from __future__ import annotations

from importlib import import_module

__all__ = [
    "GangAborted",
    "TorchrunCallRefused",
    "TorchrunException",
    "TorchrunFailed",
    "TorchrunInterrupted",
    "TorchrunInvalidArgument",
    "TorchrunResult",
    "TorchrunHandle",
]

# Where each name lives: the errors, but for these two.
_HOMES = {"TorchrunResult": ".record.result", "TorchrunHandle": ".handle"}


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    return getattr(import_module(_HOMES.get(name, ".errors"), __name__), name)


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
