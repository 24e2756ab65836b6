"""The torch a task has, read from files, never imported: whether torch is
there, which version, and which options its torchrun takes. The answer costs
milliseconds, not the seconds an ``import torch`` takes in every task.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from typing import Iterable, Optional, Set, Tuple

from ..errors import TorchrunInvalidArgument

TORCH_INSTALL_HINT = "pip install metaflow-torchrun[torch]"
# The torch this package is tested with (README "Versions").
TESTED_TORCH = "2.11"


class TorchrunMissingDependency(TorchrunInvalidArgument):
    headline = "@torchrun: missing dependency"


@dataclass(frozen=True)
class TorchInstall:
    """What a task's Python has of torch, read without importing it."""

    location: Optional[str]  # the torch package directory; None: not installed
    version: Optional[str] = None
    run_py: Optional[str] = None  # torch/distributed/run.py, when there


def find_torch() -> TorchInstall:
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return TorchInstall(None)
    location = list(spec.submodule_search_locations)[0]
    run_py = os.path.join(location, "distributed", "run.py")
    return TorchInstall(location, _torch_version(location), run_py if os.path.isfile(run_py) else None)


def _torch_version(location: str) -> Optional[str]:
    try:
        with open(os.path.join(location, "version.py"), encoding="utf-8") as f:
            match = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", f.read(), re.M)
        return match.group(1) if match else None
    except OSError:
        return None


def torchrun_options(run_py_source: str) -> Set[str]:
    """Canonical option names torchrun's parser declares, from torch/distributed/run.py."""
    start = run_py_source.find("def get_args_parser")
    end = run_py_source.find("\ndef ", start + 1)
    body = run_py_source[start:end] if start >= 0 else run_py_source
    return {m.group(1).replace("_", "-") for m in re.finditer(r"""["']--([A-Za-z][\w-]*)["']""", body)}


def torch_problem(torch: TorchInstall, python: str, passed: Iterable[str], known: Optional[Set[str]]) -> Optional[str]:
    """Why this task cannot start torchrun, naming the fix; None when it can.

    ``passed``: the torchrun options @torchrun passes; ``known``: the options this
    torch's torchrun takes (None: could not be read)."""
    fix = "Install it in the step's environment: `%s` (or torch>=%s)." % (TORCH_INSTALL_HINT, TESTED_TORCH)
    if torch.location is None:
        return "torch is not installed for %s, and @torchrun runs torchrun with it. %s" % (python, fix)
    if torch.run_py is None:
        return (
            "the torch at %s (version %s) has no torch.distributed (no torchrun). %s"
            % (torch.location, torch.version or "unknown", fix)
        )
    if known:
        missing = sorted(o for o in passed if o not in known)
        if missing:
            return (
                "torch %s at %s is too old for @torchrun: its torchrun has no %s. %s"
                % (torch.version or "(unknown version)", torch.location,
                   ", ".join("--" + o for o in missing), fix)
            )
    return None


def passed_options() -> Tuple[str, ...]:
    """The torchrun options @torchrun itself passes (command.py), and --module."""
    from .command import Launch, default_options

    launch = Launch(
        python="python", num_nodes=1, node_index=0, nproc_per_node=1,
        rdzv_host="127.0.0.1", rdzv_port=1, rdzv_id="x", entrypoint="x",
        local_addr="127.0.0.1",
    )
    return tuple(default_options(launch)) + ("module",)


def require_torch(python: Optional[str] = None) -> None:
    """Raise ``TorchrunMissingDependency`` before anything starts when this task's
    Python cannot run torchrun: no torch, no torch.distributed, or a torch whose
    torchrun lacks an option we pass."""
    torch = find_torch()
    problem = torch_problem(torch, python or sys.executable, passed_options(), _options_of(torch.run_py))
    if problem:
        raise TorchrunMissingDependency(problem)


def known_torchrun_options() -> Optional[Set[str]]:
    """The options this task's torchrun takes, or None when they cannot be read."""
    return _options_of(find_torch().run_py)


def _options_of(run_py: Optional[str]) -> Optional[Set[str]]:
    if run_py is None:
        return None
    try:
        with open(run_py, encoding="utf-8") as f:
            return torchrun_options(f.read()) or None
    except OSError:
        return None
