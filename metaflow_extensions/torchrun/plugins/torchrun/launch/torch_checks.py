"""The torch a task has, read from files in milliseconds, never imported (seconds in every task): whether
it is there, its version, and which options its torchrun takes."""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Set, Tuple

from ..errors import TorchrunMissingDependency
from .command import Launch, default_options
from .options import OptionSpec

# The torch this package is tested with, said here only (a unit test keeps requirements-demo.txt's pin,
# the README and the getting-started page equal to it).
TESTED_TORCH = "2.13.0"
MIN_TORCH = "2.11"  # the oldest supported (setup.py's [torch] extra, docs/versions.md)
# A missing torch's fix installs the tested one (an unpinned one is the newest, with its CUDA packages).
TORCH_INSTALL_HINT = 'pip install "torch==%s" numpy' % TESTED_TORCH


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


# argparse actions that take no value (torch's own ``check_env`` too); those that take one.
FLAG_ACTIONS = frozenset({"check_env", "store_true", "store_false", "store_const", "count", "help", "version"})
VALUE_ACTIONS = frozenset({"store", "env", "_PrintCompletionAction"})  # the last: torch 2.14's --print-completion
_ADD = re.compile(r"\.add_argument\(")
_KEYWORD = re.compile(r"\b[a-z_]+\s*=")
_NAME = re.compile(r"""["'](--?[A-Za-z][\w-]*)["']""")
_ACTION = re.compile(r"""\baction\s*=\s*["']?([\w.]+)""")
_TYPE = re.compile(r"\btype\s*=\s*(\w+)")
_NARGS = re.compile(r"""\bnargs\s*=\s*["']?([^,"'\s)]+)""")
_CHOICES = re.compile(r"\bchoices\s*=\s*(\[[^\]]*\]|\([^)]*\))")

# The options @torchrun reads, checked even when this torch's source cannot be read.
READ_BY_US: Dict[str, OptionSpec] = {
    "max-restarts": OptionSpec(takes_value=True, type="int"),
    "nproc-per-node": OptionSpec(takes_value=True, type="str"),
}


@functools.lru_cache(maxsize=4)
def torchrun_option_specs(run_py_source: str) -> Dict[str, OptionSpec]:
    """How torchrun's parser reads each option, from ``get_args_parser``'s ``add_argument`` calls: a flag
    or one value, and its ``type``; any other action or ``nargs`` left out (passed unchecked).
    tests/unit/test_torch_options.py compares the result with the real parser."""
    start = run_py_source.find("def get_args_parser")
    if start < 0:
        return {}
    end = run_py_source.find("\ndef ", start + 1)
    body = run_py_source[start:end if end > 0 else len(run_py_source)]
    starts = [m.end() for m in _ADD.finditer(body)] + [len(body)]
    specs: Dict[str, OptionSpec] = {}
    for begin, stop in zip(starts, starts[1:]):
        call = body[begin:stop]
        first_keyword = _KEYWORD.search(call)
        names = _NAME.findall(call[:first_keyword.start() if first_keyword else len(call)])
        long_names = [n for n in names if n.startswith("--")]
        if not long_names:
            continue  # a positional argument (the script and its arguments)
        spec = _spec_of(call)
        if spec is not None:
            specs[long_names[0][2:].replace("_", "-")] = spec
    return specs


def _spec_of(call: str) -> Optional[OptionSpec]:
    action = _ACTION.search(call)
    nargs = _NARGS.search(call)
    kind = _TYPE.search(call)
    name = action.group(1).rsplit(".", 1)[-1] if action else "store"
    if nargs is not None:
        return OptionSpec(takes_value=False) if nargs.group(1) == "0" else None
    if name in FLAG_ACTIONS:
        return OptionSpec(takes_value=False)
    if name not in VALUE_ACTIONS:
        return None
    type_name = kind.group(1) if kind else "str"
    return OptionSpec(takes_value=True, type=type_name if type_name in ("int", "float") else "str",
                      choices=_choices(call))


def _choices(call: str) -> Optional[Tuple[str, ...]]:
    """An option's literal choices; None when computed (``--numa-binding``): torch's parser names a wrong one."""
    found = _CHOICES.search(call)
    if found is None:
        return None
    try:
        values = ast.literal_eval(found.group(1))
    except (ValueError, SyntaxError):
        return None
    return tuple(str(v) for v in values) if all(isinstance(v, str) for v in values) else None


def torch_problem(torch: TorchInstall, python: str, passed: Iterable[str], known: Optional[Set[str]]) -> Optional[str]:
    """Why this task cannot start torchrun, naming the fix; None when it can. ``passed``: the options
    @torchrun passes; ``known``: those this torch's torchrun takes (None: unreadable)."""
    fix = "Install it in the step's environment: `%s` (the torch @torchrun is tested with; torch>=%s is supported)." % (
        TORCH_INSTALL_HINT, MIN_TORCH)
    if torch.location is None:
        return "torch is not installed for %s, and @torchrun runs torchrun with it. %s" % (python, fix)
    if torch.run_py is None:
        return ("the torch at %s (version %s) has no torch.distributed (no torchrun). %s"
                % (torch.location, torch.version or "unknown", fix))
    if known:
        missing = sorted(o for o in passed if o not in known)
        if missing:
            return ("torch %s at %s is too old for @torchrun: its torchrun has no %s. %s" % (
                torch.version or "(unknown version)", torch.location, ", ".join("--" + o for o in missing), fix))
    return None


def passed_options() -> Tuple[str, ...]:
    """The torchrun options @torchrun itself passes (command.py), and --module."""
    launch = Launch(python="python", num_nodes=1, node_index=0, nproc_per_node=1, rdzv_host="127.0.0.1",
                    rdzv_port=1, rdzv_id="x", entrypoint="x", local_addr="127.0.0.1")
    return tuple(default_options(launch)) + ("module",)


PASSED_OPTIONS = passed_options()  # the same for every call: read once


@dataclass(frozen=True)
class TorchrunOptions:
    """This task's torchrun options, read once for a call: their names (None:
    unreadable) and how its parser reads each (over ``READ_BY_US``)."""

    names: Optional[Set[str]]
    specs: Dict[str, OptionSpec]


def read_torchrun(torch: Optional[TorchInstall] = None) -> TorchrunOptions:
    source = _source_of((torch or find_torch()).run_py)
    specs = dict(READ_BY_US)
    if source is None:
        return TorchrunOptions(None, specs)
    specs.update(torchrun_option_specs(source))
    return TorchrunOptions(torchrun_options(source) or None, specs)


def require_torch(python: Optional[str] = None) -> TorchrunOptions:
    """Raise ``TorchrunMissingDependency`` before anything starts when this task's
    Python cannot run torchrun: no torch, no torch.distributed, or a torch whose
    torchrun lacks an option we pass. Returns what it read of torchrun's options."""
    torch = find_torch()
    options = read_torchrun(torch)
    problem = torch_problem(torch, python or sys.executable, PASSED_OPTIONS, options.names)
    if problem:
        raise TorchrunMissingDependency(problem)
    return options


def known_torchrun_options() -> Optional[Set[str]]:
    """The options this task's torchrun takes, or None when they cannot be read."""
    return read_torchrun().names


def known_option_specs() -> Dict[str, OptionSpec]:
    return read_torchrun().specs


def _source_of(run_py: Optional[str]) -> Optional[str]:
    """torch/distributed/run.py's text, read again only when the file changed."""
    if run_py is None:
        return None
    try:
        st = os.stat(run_py)
    except (OSError, ValueError):
        return None
    return _read_source(run_py, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _read_source(run_py: str, mtime_ns: int, size: int) -> Optional[str]:
    try:
        with open(run_py, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeError, ValueError):
        return None
