"""The @torchrun implementation; docs/design.md (in the project) says how the modules fit.

What users import is also in ``metaflow`` itself (``from metaflow import
TorchrunFailed, TorchrunResult``: ``toplevel/torchrun_toplevel.py``). This
``__init__`` stays import-light: every rank imports ``procs/`` modules through
it, with no Metaflow, so the public names load on first use.
"""

from importlib import import_module
from typing import Any

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

_HOMES = {
    "GangAborted": ".errors",
    "TorchrunCallRefused": ".errors",
    "TorchrunException": ".errors",
    "TorchrunFailed": ".errors",
    "TorchrunInterrupted": ".errors",
    "TorchrunInvalidArgument": ".errors",
    "TorchrunResult": ".record.result",
    "TorchrunHandle": ".handle",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    return getattr(import_module(home, __name__), name)


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
