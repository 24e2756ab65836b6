"""Compatibility, in pure functions: the Metaflow versions we support, code written
for metaflow-torchrun 0.2, and the torch a task has.

Nothing here imports torch: whether torch is there, which version, and which
options its torchrun takes are read from files, so the answer costs milliseconds,
not the seconds an ``import torch`` takes in every task.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from .errors import TorchrunInvalidArgument

# ---------------------------------------------------------------- Metaflow versions


def accepts_keyword(func: Callable[..., Any], name: str) -> bool:
    """Whether ``func`` takes the keyword ``name`` (Metaflow grows hook arguments
    over versions; feature detection beats version numbers)."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def decorator_init_kwargs(parent_init: Callable[..., Any], inserted_by: Any) -> Dict[str, Any]:
    """Keyword arguments for ``StepDecorator.__init__`` beyond attributes and
    statically_defined: ``inserted_by`` exists from Metaflow 2.16 on."""
    if accepts_keyword(parent_init, "inserted_by"):
        return {"inserted_by": inserted_by}
    return {}


def meta_datum() -> Any:
    """Metaflow's ``MetaDatum``: in ``metaflow.metadata_provider`` since Metaflow
    2.12.x renamed the package, in ``metaflow.metadata`` before."""
    try:
        from metaflow.metadata_provider import MetaDatum
    except ImportError:
        from metaflow.metadata import MetaDatum
    return MetaDatum


def local_control_task_id(task_id: str) -> str:
    """The control task's id, seen from a local worker node whose environment does
    not name it (Metaflow before 2.16 sets no MF_PARALLEL_CONTROL_TASK_ID). Local
    workers are "<run>-<split step>-<n>_node_<i>" and their control is
    "control-<run>-<split step>-<n>"; every node must derive the same gang id."""
    prefix = str(task_id).split("_node_")[0]
    return prefix if prefix.startswith("control-") else "control-" + prefix


# ---------------------------------------------------- metaflow-torchrun 0.2 names

# Old attribute name -> the attribute that does the same here.
ATTRIBUTE_ALIASES = {
    "master_port": "port",
    "all_nodes_started_timeout": "start_timeout",
}


@dataclass
class LegacyAttributes:
    """``@torchrun(...)`` attributes with 0.2 names translated; what to tell."""

    attributes: Dict[str, Any]
    deprecations: List[str] = field(default_factory=list)
    conflicts: List[str] = field(default_factory=list)


def translate_attributes(attributes: Optional[Mapping[str, Any]]) -> LegacyAttributes:
    """Rename 0.2 attributes (``master_port``, ``all_nodes_started_timeout``) to
    their names here. Giving both spellings is a conflict, reported at flow start."""
    out = dict(attributes or {})
    result = LegacyAttributes(out)
    for old, new in ATTRIBUTE_ALIASES.items():
        if old not in out:
            continue
        value = out.pop(old)
        if out.get(new) is not None and out[new] != value:
            result.conflicts.append(
                "@torchrun(%s=%r, %s=%r): %s is the metaflow-torchrun 0.2 name of %s; "
                "give only %s." % (old, value, new, out[new], old, new, new)
            )
            continue
        out[new] = value
        result.deprecations.append(
            "@torchrun: %s= is deprecated (metaflow-torchrun 0.2); it is now %s=, "
            "which this step uses." % (old, new)
        )
    return result


def is_task_process(argv: Iterable[str]) -> bool:
    """A Metaflow task (``flow.py ... step <name> ...``) rather than the command
    the user typed: deprecation lines are said once, by the latter."""
    return "step" in list(argv)[1:]


def legacy_notes(legacy: LegacyAttributes, say: Callable[[str], None], argv: Iterable[str]) -> None:
    """At flow start: refuse conflicting spellings; say each deprecation once."""
    if legacy.conflicts:
        raise TorchrunInvalidArgument(" ".join(legacy.conflicts))
    if not is_task_process(argv):
        for line in legacy.deprecations:
            say(line)


class TorchrunSingleNodeMultiGPU:
    """metaflow-torchrun 0.2's single-node launcher. Not provided: a ``@torchrun``
    step entered with ``num_parallel=1`` does the same, supervised."""

    MESSAGE = (
        "TorchrunSingleNodeMultiGPU (metaflow-torchrun 0.2) is not part of this package. "
        "Put @torchrun on the step, enter it with self.next(self.<step>, num_parallel=1) "
        "(one node), and call current.torch.run(entrypoint=..., nproc_per_node=N) in it. "
        "See 'Coming from metaflow-torchrun 0.2' in the README."
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TorchrunInvalidArgument(self.MESSAGE)


# ----------------------------------------------------------- options we own

_RENDEZVOUS = (
    "@torchrun runs torchrun's c10d rendezvous on the control node and chooses its "
    "endpoint and id per gang; extra settings go in rdzv_conf, which adds to ours"
)
_ENTRY = (
    "@torchrun starts every rank through its own bootstrap: give a script path or a "
    "module-level function as current.torch.run(entrypoint=...)"
)

# Canonical torchrun option -> how to get what it does with @torchrun.
OWNED_OPTIONS: Dict[str, str] = {
    "master-port": "the port is @torchrun(port=N) (on Kubernetes, @kubernetes(port=N) is used)",
    "master-addr": "@torchrun finds the control node's address itself (current.parallel.main_ip)",
    "nnodes": "the node count is num_parallel: self.next(self.<step>, num_parallel=N)",
    "node-rank": "each node's index comes from Metaflow (current.parallel.node_index)",
    "rdzv-backend": _RENDEZVOUS,
    "rdzv-endpoint": _RENDEZVOUS,
    "rdzv-id": _RENDEZVOUS,
    "standalone": "for one node, enter the step with num_parallel=1",
    "no-python": _ENTRY,
    "module": _ENTRY,
    "run-path": _ENTRY,
    "shutdown-timeout": "the ranks' time to stop on SIGTERM is @torchrun(shutdown_grace=SECONDS)",
}


def owned_option_error(name: str, what: str) -> Optional[str]:
    """A message for an option @torchrun sets itself, naming the @torchrun way."""
    reason = OWNED_OPTIONS.get(name)
    if reason is None:
        return None
    return "%s: --%s is set by @torchrun and cannot be given: %s." % (what, name, reason)


def refuse_owned(options: Mapping[str, Any], what: str) -> None:
    problems = [m for m in (owned_option_error(k, what) for k in options) if m]
    if problems:
        raise TorchrunInvalidArgument(" ".join(problems))


def is_pair_list(tokens: List[str]) -> bool:
    """metaflow-torchrun 0.2's list form, ``["nproc_per_node", 2, "max_restarts", 1]``:
    names without dashes, each followed by its value. A list starting with a
    dashed option is argv as torchrun takes it."""
    return bool(tokens) and not tokens[0].startswith("-")


def none_value_error(what: str, key: Any) -> str:
    return (
        "%s[%r] is None. Write True for a bare --%s (what metaflow-torchrun 0.2 made "
        "of None), or False (or no entry) to leave it out."
        % (what, key, str(key).lstrip("-"))
    )


def empty_option_error(what: str, key: Any) -> str:
    return (
        "%s[%r] is ''. torchrun options take no empty value: write True for a bare "
        "--%s (what metaflow-torchrun 0.2 made of ''), or False to leave it out."
        % (what, key, str(key).lstrip("-"))
    )


# ------------------------------------------------------------------- torch

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
    from .launch.command import Launch, default_options

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
    import sys

    torch = find_torch()
    known: Optional[Set[str]] = None
    if torch.run_py:
        try:
            with open(torch.run_py, encoding="utf-8") as f:
                known = torchrun_options(f.read()) or None
        except OSError:
            known = None
    problem = torch_problem(torch, python or sys.executable, passed_options(), known)
    if problem:
        raise TorchrunMissingDependency(problem)
