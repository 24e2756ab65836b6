"""Pure planning: what one ``current.torch.run`` call will launch.

Everything the step's ``@torchrun`` attributes and a call's arguments decide is
resolved here, before anything starts: the entrypoint, its arguments, the
process count and torchrun's options, and the environment the ranks get. A
mistake is a ``TorchrunInvalidArgument`` naming it, raised in the step, never
an error from inside torchrun after the gang has started.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .. import defaults as DEFAULTS
from ..procs import functions, names
from ..procs.names import SHARE_STORE_OFF_ENV, SHUTDOWN_TIMEOUT_ENV  # noqa: F401 (tests)
from .command import ArgSpec, encode_args, none_keys, restarts_allowed, true_keys  # noqa: F401 (call.py)
from .options import canonical_option, parse_options
from .torch_checks import known_option_specs, known_torchrun_options
from .inputs import (
    check_arguments,
    check_command_size,
    check_path_text,
    check_picklable,
    check_python_source,
    check_nproc_bound,
    refuse_directory,
    refuse_special,
    validate_hang_timeout,  # noqa: F401 (decorator.py's step_init imports these from here)
    validate_shutdown_grace,  # noqa: F401
    step_timeout,  # noqa: F401
    validate_timeouts,  # noqa: F401
)
from ..errors import Problems, TorchrunInvalidArgument, did_you_mean, shown
from ..gang.ports import parse_port
from .resources import NONE as NO_ACCELERATORS
from .resources import Accelerators

# torch's switch for a store of the ranks' own rather than the agent's (SHARE_STORE_OFF_ENV),
# and its agent's grace on shutdown (SHUTDOWN_TIMEOUT_ENV): names.py.

# torchrun's own spellings for "as many processes as there are devices/cores".
NPROC_KEYWORDS = ("auto", "gpu", "cpu", "xpu")


@dataclass(frozen=True)
class StepDefaults:
    """What ``@torchrun(...)`` set for the step; call arguments override it."""

    nproc_per_node: Any = None
    torchrun_args: ArgSpec = None
    port: Optional[int] = None
    derived_nproc: Optional[int] = None
    accelerators: Accelerators = NO_ACCELERATORS
    heartbeat_timeout: float = DEFAULTS.HEARTBEAT_TIMEOUT
    start_timeout: float = DEFAULTS.START_TIMEOUT
    label_logs: bool = DEFAULTS.LABEL_LOGS
    hang_timeout: Optional[float] = DEFAULTS.HANG_TIMEOUT
    shutdown_grace: float = DEFAULTS.SHUTDOWN_GRACE
    # torchrun's rendezvous port on the control; None: picked free per call.
    rdzv_port: Optional[int] = None
    # How a dict of entrypoint_args is spelled (command.ARGS_STYLES).
    args_as: str = DEFAULTS.ARGS_AS
    # @torchrun(preflight=...): gang/node_compare.py MODES.
    preflight: str = "versions"


@dataclass(frozen=True)
class CallPlan:
    """One call, resolved: what every rank of this node will run."""

    entry_name: str  # the same on every node for the same call (checked)
    script: Optional[str]  # an absolute path; None for a function
    entry_argv: List[str]
    function: Optional[functions.FunctionRef]
    function_args: Any
    nproc: Union[int, str]
    options: Dict[str, Any] = field(default_factory=dict)
    rdzv_port: Optional[int] = None  # pinned; None: the gang's pick
    # Keys of a dict given as True (a bare flag here, "--key true" in 0.2): named
    # when a rank's argparse wanted a value for one (compat.argparse_hint).
    true_keys: Tuple[str, ...] = ()
    # Deprecation lines for metaflow-torchrun 0.2 spellings, said once per step.
    notes: Tuple[str, ...] = ()


def validate_nproc(value: Any, source: str) -> Union[int, str]:
    """A positive process count, or one of torchrun's device keywords."""
    if isinstance(value, bool):
        raise TorchrunInvalidArgument(
            "%s=%s: nproc_per_node must be a positive integer." % (source, shown(value))
        )
    if isinstance(value, str):
        text = value.strip()
        if text in NPROC_KEYWORDS:
            return text
        try:
            value = int(text)
        except ValueError:
            raise TorchrunInvalidArgument(
                "%s=%s: nproc_per_node must be a positive integer (or one of %s)."
                % (source, shown(value), ", ".join(NPROC_KEYWORDS))
            ) from None
    if not isinstance(value, int):
        raise TorchrunInvalidArgument(
            "%s=%s (a %s): nproc_per_node must be a positive integer."
            % (source, shown(value), type(value).__name__)
        )
    if value < 1:
        raise TorchrunInvalidArgument(
            "%s=%s: nproc_per_node must be at least 1." % (source, shown(value))
        )
    check_nproc_bound(value, source)
    return value


def resolve_nproc(
    call_value: Any,
    user_options: Mapping[str, Any],
    defaults: StepDefaults,
) -> Union[int, str]:
    """Precedence: run() argument > torchrun_args > @torchrun > resources > 1."""
    if call_value is not None:
        return validate_nproc(call_value, "nproc_per_node")
    if user_options.get("nproc-per-node") not in (None, False):
        return validate_nproc(user_options["nproc-per-node"], "torchrun_args nproc_per_node")
    if defaults.nproc_per_node is not None:
        return validate_nproc(defaults.nproc_per_node, "@torchrun(nproc_per_node)")
    if defaults.derived_nproc is not None:
        return validate_nproc(defaults.derived_nproc, "resources")
    return 1


def resolve_entrypoint(entrypoint: Any, search_dirs: Sequence[str]) -> str:
    """An absolute path to an existing script, looked up relative to the task's
    working directory first and then to the flow file's directory, so
    ``python examples/ddp/flow.py run`` finds ``train.py`` beside the flow."""
    try:
        path = os.fspath(entrypoint) if isinstance(entrypoint, (str, os.PathLike)) else None
    except Exception as e:  # a user's __fspath__
        raise TorchrunInvalidArgument(
            "entrypoint %s: os.fspath() failed: %s: %s." % (shown(entrypoint), type(e).__name__, e)
        ) from None
    if not path or not isinstance(path, str):  # bytes from __fspath__ too: paths here are text
        raise TorchrunInvalidArgument(
            "entrypoint must be the path of a Python script, not %s." % (shown(entrypoint),)
        )
    check_path_text(path, "entrypoint")
    candidates = [path] if os.path.isabs(path) else list(dict.fromkeys(
        os.path.join(os.path.abspath(d), path) for d in search_dirs  # the flow's dir is often the cwd
    ))
    for candidate in candidates:
        if os.path.isfile(candidate):
            found = os.path.abspath(candidate)
            check_python_source(found, path)
            return found
    for candidate in candidates:
        refuse_directory(candidate, path)
        refuse_special(candidate, path)
    dirs = list(dict.fromkeys(os.path.dirname(os.path.abspath(c)) for c in candidates))
    raise TorchrunInvalidArgument(
        "entrypoint %s does not exist in %s%s."
        % (shown(path), " or ".join(dirs), did_you_mean(os.path.basename(path), python_files(dirs)))
    )


# A directory is listed this far for a "did you mean": a huge one costs no more.
LISTED_PER_DIR = 2000


def python_files(dirs: Sequence[str]) -> List[str]:
    """Names of the Python files in ``dirs``, at most ``LISTED_PER_DIR`` each."""
    names: List[str] = []
    for d in dirs:
        try:
            with os.scandir(d) as entries:
                for i, entry in enumerate(entries):
                    if i >= LISTED_PER_DIR:
                        break
                    if entry.name.endswith(".py"):
                        names.append(entry.name)
        except OSError:
            continue
    return names


def check_options(options: Mapping[str, Any]) -> None:
    if not options:
        return
    known = known_torchrun_options()
    if known is None:
        return
    unknown = sorted(k for k in options if k not in known)
    if unknown:
        raise TorchrunInvalidArgument(
            "torchrun_args: unknown torchrun option%s %s (see `python -m "
            "torch.distributed.run --help`)."
            % ("s" if len(unknown) > 1 else "",
               ", ".join("--" + k + did_you_mean(k, known, "--%s") for k in unknown))
        )


# metaflow-torchrun 0.2's torchrun option for the port its rendezvous listened
# on: accepted in torchrun_args as the rendezvous port, with a deprecation line.
LEGACY_PORT_OPTION = "master-port"


def merged_options(defaults: StepDefaults, call_args: ArgSpec) -> Dict[str, Any]:
    """The step's and the call's torchrun options, the call's winning; both
    read in full, so that every problem in either is named at once. May hold
    ``LEGACY_PORT_OPTION`` (``legacy_rdzv_port`` takes it out). Each value
    is checked against how this torch's torchrun reads its option (a flag or
    a value, its type), read from torch's source without importing it."""
    problems = Problems()
    allow = (LEGACY_PORT_OPTION,)
    specs = known_option_specs()
    step = problems.check(parse_options, defaults.torchrun_args, "@torchrun(torchrun_args)", allow=allow, specs=specs)
    call = problems.check(parse_options, call_args, "torchrun_args", allow=allow, specs=specs)
    problems.raise_all()
    options = dict(step or {})
    options.update(call or {})
    return options


def option_names(args: ArgSpec) -> Dict[str, Any]:
    """The option names of a dict of torchrun_args, whatever their values: so
    that an unknown name is reported with a refused value, in one message."""
    if not isinstance(args, Mapping):
        return {}
    return {canonical_option(k): True for k in args if isinstance(k, str) and k.strip("-")}


def legacy_rdzv_port(options: Dict[str, Any], where: str) -> Tuple[Optional[int], List[str]]:
    """Take 0.2's ``master_port`` out of ``options``: it pinned the port
    torchrun's rendezvous listened on, which ``@torchrun(rdzv_port=N)`` pins
    here. Returns the port and the deprecation line."""
    if LEGACY_PORT_OPTION not in options:
        return None, []
    value = options.pop(LEGACY_PORT_OPTION)
    port = parse_port(value if value is not True else "", "%s master_port" % where)
    if port is None:
        raise TorchrunInvalidArgument("%s master_port=%s: give a port number." % (where, shown(value)))
    return port, [legacy_port_note(where, port)]


def legacy_port_note(where: str, port: int) -> str:
    return (
        "%s master_port=%d is deprecated (metaflow-torchrun 0.2); it pins torchrun's "
        "rendezvous port, as in 0.2: write @torchrun(rdzv_port=%d). The gang service's port is "
        "@torchrun(port=N)." % (where, port, port)
    )


def none_note(keys: Sequence[str], what: str) -> str:
    return (
        "%s: None for a bare flag is deprecated (metaflow-torchrun 0.2): %s passed as "
        "bare flag%s; write True." % (what, ", ".join("--" + k.lstrip("-") for k in keys),
                                       "s" if len(keys) > 1 else "")
    )


def function_reference(entrypoint: Any, args: Any) -> Optional[functions.FunctionRef]:
    """A reference ranks can import, when the entrypoint is a function."""
    if isinstance(entrypoint, (str, os.PathLike)) or not callable(entrypoint):
        return None
    try:
        ref = functions.reference_to(entrypoint)
        functions.split_args(args)
    except (functions.FunctionReferenceError, TypeError) as e:
        raise TorchrunInvalidArgument(str(e)) from None
    check_picklable(args)
    return ref


def plan_call(
    entrypoint: Union[str, "os.PathLike[str]", Callable[..., Any]],
    entrypoint_args: Any,
    nproc_per_node: Any,
    torchrun_args: ArgSpec,
    defaults: StepDefaults,
    search_dirs: Sequence[str],
) -> CallPlan:
    """Resolve a call's arguments; raise one ``TorchrunInvalidArgument``
    naming every problem found."""
    problems = Problems()
    function = problems.check(function_reference, entrypoint, entrypoint_args)
    script: Optional[str] = None
    entry_argv: List[str] = []
    notes: List[str] = []
    if function is None and not problems.messages:
        script = problems.check(resolve_entrypoint, entrypoint, search_dirs)
        entry_argv = problems.check(encode_args, entrypoint_args, "entrypoint_args", defaults.args_as) or []
        problems.check(check_arguments, entry_argv)
        if none_keys(entrypoint_args):
            notes.append(none_note(none_keys(entrypoint_args), "entrypoint_args"))
    options = problems.check(merged_options, defaults, torchrun_args) or {}
    for source, args in (("@torchrun(torchrun_args)", defaults.torchrun_args), ("torchrun_args", torchrun_args)):
        if none_keys(args):
            notes.append(none_note(none_keys(args), source))
    pinned = problems.check(legacy_rdzv_port, options, "torchrun_args")
    rdzv_port, port_notes = pinned if pinned is not None else (None, [])
    notes.extend(port_notes)
    problems.check(check_options, options)
    problems.check(check_command_size, options, os.environ)
    nproc = problems.check(resolve_nproc, nproc_per_node, options, defaults)
    problems.raise_all()
    options.pop("nproc-per-node", None)  # resolved above, with its precedence
    name = function.qualname if function is not None else os.path.basename(script or "")
    return CallPlan(
        entry_name=name,
        script=script,
        entry_argv=entry_argv,
        function=function,
        function_args=entrypoint_args,
        nproc=nproc if nproc is not None else 1,
        options=options,
        rdzv_port=rdzv_port if rdzv_port is not None else defaults.rdzv_port,
        true_keys=tuple(true_keys(entrypoint_args)) if function is None and defaults.args_as != "0.2" else (),
        notes=tuple(notes),
    )


def rank_environment(
    base: Mapping[str, str],
    *,
    workdir: str,
    node_index: int,
    label_logs: bool,
    log_dir: Optional[str],
    iface: Optional[str],
    flow_dir: Optional[str],
    is_function: bool,
    shutdown_grace: Optional[float] = None,
    restarts: bool = True,
) -> Dict[str, str]:
    """The environment of this node's torchrun and its ranks."""
    env = dict(base)
    if shutdown_grace is not None:
        # torchrun's own graceful stop (torch 2.10+; before, a fixed 30 s): on
        # SIGTERM its agent passes the signal on to the ranks and waits this
        # long before SIGKILL. Whole seconds: the agent parses an int.
        env[SHUTDOWN_TIMEOUT_ENV] = str(int(math.ceil(shutdown_grace)))
    if is_function and flow_dir:
        # Ranks import the function's module as the flow file would: from the
        # flow's directory.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (flow_dir, env.get("PYTHONPATH")) if p)
    env[names.WORK_DIR_ENV] = workdir
    env[names.NODE_INDEX_ENV] = str(node_index)
    if iface and "GLOO_SOCKET_IFNAME" not in env:
        # gloo otherwise binds to whatever the host name resolves to, which
        # on many hosts (127.0.1.1, containers) other nodes cannot reach.
        env["GLOO_SOCKET_IFNAME"] = iface
    if restarts:
        # With the agent's store shared with the workers, torch keeps one store
        # for every restart and restarted workers read the previous round's
        # addresses (gloo: "Connection refused"): max_restarts could never
        # recover. A fresh store per round, hosted by rank 0, is what torch
        # does with sharing off. Only then: the ranks' init_process_group waits
        # about 0.5 s longer for rank 0's new store (benchmarks, 2 x 2).
        env.setdefault(SHARE_STORE_OFF_ENV, "1")
    env[names.LABELS_ENV] = "1" if label_logs else "0"
    if log_dir:
        env[names.LOG_DIR_ENV] = log_dir
    return env
