"""The @torchrun implementation; docs/design.md says how the modules fit. Import-light (every rank
imports ``procs/`` through it, with no Metaflow): the public names load on first use.
"""

from __future__ import annotations

from importlib import import_module

TYPE_CHECKING = False  # typing unimported: every rank's stand-in imports this package (procs/handoff.py)
if TYPE_CHECKING:
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

# Where each name lives: the errors, but for these two.
_HOMES = {"TorchrunResult": ".record.result", "TorchrunHandle": ".handle"}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    return getattr(import_module(_HOMES.get(name, ".errors"), __name__), name)


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
