"""Pure planning: a call's arguments over the step's ``@torchrun`` attributes,
resolved before anything starts; every mistake named in one ``TorchrunInvalidArgument``
in the step, never an error from inside torchrun after the gang has started."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..base import defaults as DEFAULTS
from ..base.knobs import Knobs
from ..procs import functions
from .command import ArgSpec, EntryArgs, check_command_size, entry_arguments, keys_given, restarts_allowed
from .options import OWNED_OPTIONS, UNUSABLE_OPTIONS, canonical_option, parse_options
from .torch_checks import TorchrunOptions, known_option_specs, known_torchrun_options, require_torch
from .inputs import check_picklable, resolve_entrypoint, restarts_clash, retry_on_clash
from ..errors import Problems, TorchrunInvalidArgument, did_you_mean, shown
from ..gang import parse_port
from .resources import NO_ACCELERATORS, Accelerators

# More processes on one node is a typo (a GPU count in the wrong unit, an extra zero), not a machine.
MAX_NPROC_PER_NODE = 1024

# torchrun's own spellings for "as many processes as there are devices/cores".
NPROC_KEYWORDS = ("auto", "gpu", "cpu", "xpu")


@dataclass(frozen=True)
class StepDefaults:
    """What ``@torchrun(...)`` and Metaflow's configuration set for the step; a call's arguments override it."""

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
    rdzv_port: Optional[int] = None  # torchrun's rendezvous port on the control; None: picked free per call
    args_as: str = DEFAULTS.ARGS_AS  # how a dict of entrypoint_args is spelled (command.ARGS_STYLES)
    preflight: str = DEFAULTS.PREFLIGHT  # @torchrun(preflight=...): gang/preflight_modes.py parse_mode
    restarts: int = DEFAULTS.RESTARTS  # @torchrun(restarts=N): the gang restarts a call's ranks in the same tasks
    spares: int = DEFAULTS.SPARES  # @torchrun(spares=K): K nodes wait to replace a bad one (gang/bench.py)
    min_nodes: Optional[int] = DEFAULTS.MIN_NODES  # @torchrun(min_nodes=M): a lost node's gang goes on with M or more
    regrow: bool = DEFAULTS.REGROW  # a lost node that comes back brings the gang back to its size
    swap_stragglers: Optional[float] = DEFAULTS.SWAP_STRAGGLERS  # a rank named by arrival this long: its node out
    snapshot_every: Optional[int] = None  # in-memory snapshots: None off; 0 the trainers' interval from cost; N
    snapshot_memory: Optional[float] = None  # the store's budget: MB (> 1) or a share of available memory (<= 1)
    retry_on: Optional[str] = None  # as spec.py read it: "infrastructure" refuses torch's own restart
    knobs: Knobs = Knobs()  # the METAFLOW_TORCHRUN_* settings, as the step's start read them (knobs.py)


class _NoEntrypoint:
    """A call that named no entrypoint: refused as such, not as ``None``."""

    def __repr__(self) -> str:
        return "<no entrypoint>"


NO_ENTRYPOINT: Any = _NoEntrypoint()


@dataclass(frozen=True)
class CallRequest:
    """One call as the user wrote it, before anything is checked."""

    entrypoint: Any
    entrypoint_args: Any = None
    nproc_per_node: Any = None
    torchrun_args: ArgSpec = None
    legacy: Mapping[str, Any] = field(default_factory=dict)  # keywords run() does not take: 0.1/0.2's, typos
    api: str = "current.torch.run"  # what the user called, as a refusal names it
    problems: Tuple[str, ...] = ()  # what is wrong with the call's shape (call_request), named with the rest
    order: Tuple[str, ...] = ("entrypoint", "entrypoint_args", "nproc_per_node", "torchrun_args")


@dataclass(frozen=True)
class CallPlan:
    """One call, resolved: what every rank of this node will run."""

    entry_name: str  # the same on every node for the same call (checked)
    script: Optional[str]  # an absolute path; None for a function
    entry_argv: List[str]
    function: Optional[functions.FunctionRef]
    function_args: Any
    nproc: Union[int, str]
    function_pickle: bytes = b""  # function_args as planning pickled them, written for the ranks as is
    options: Dict[str, Any] = field(default_factory=dict)
    rdzv_port: Optional[int] = None  # pinned; None: the gang's pick
    # Keys of a dict given as True (a bare flag here, "--key true" in 0.2): named when a rank's argparse
    # wanted a value for one (compat.argparse_hint).
    true_keys: Tuple[str, ...] = ()
    torch_restarts: bool = False  # torch's own restart (max_restarts > 0): a fresh store per round
    notes: Tuple[str, ...] = ()  # deprecation lines for metaflow-torchrun 0.2 spellings, said once per step


def validate_nproc(value: Any, source: str) -> Union[int, str]:
    """A positive process count, or one of torchrun's device keywords."""
    if isinstance(value, bool):
        raise TorchrunInvalidArgument("%s=%s: nproc_per_node must be a positive integer." % (source, shown(value)))
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
        raise TorchrunInvalidArgument("%s=%s (a %s): nproc_per_node must be a positive integer."
                                      % (source, shown(value), type(value).__name__))
    if value < 1:
        raise TorchrunInvalidArgument("%s=%s: nproc_per_node must be at least 1." % (source, shown(value)))
    if value > MAX_NPROC_PER_NODE:
        raise TorchrunInvalidArgument("%s=%s: nproc_per_node must be at most %d (processes on one node; one per "
                                      "GPU is usual)." % (source, shown(value), MAX_NPROC_PER_NODE))
    return value


def resolve_nproc(call_value: Any, user_options: Mapping[str, Any], defaults: StepDefaults) -> Union[int, str]:
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


def check_options(options: Mapping[str, Any], torchrun: Optional[TorchrunOptions] = None) -> None:
    """``torchrun``: what the call's ``require_torch`` read (else read here)."""
    if not options:
        return
    known = torchrun.names if torchrun is not None else known_torchrun_options()
    if known is None:
        return
    unknown = sorted(k for k in options if k not in known)
    if unknown:
        raise TorchrunInvalidArgument(
            "torchrun_args: unknown torchrun option%s %s (see `python -m torch.distributed.run --help`)."
            % ("s" if len(unknown) > 1 else "", ", ".join("--" + k + did_you_mean(k, known, "--%s") for k in unknown)))


# 0.2's option for its rendezvous port: accepted in torchrun_args as ours, with a deprecation line.
LEGACY_PORT_OPTION = "master-port"


def merged_options(defaults: StepDefaults, call_args: ArgSpec, problems: Optional[Problems] = None,
                   torchrun: Optional[TorchrunOptions] = None) -> Dict[str, Any]:
    """The step's and the call's torchrun options, the call's winning, each value checked as this torch's
    torchrun reads it; every problem in either kept in ``problems`` (then ``{}``), or raised. May hold
    ``LEGACY_PORT_OPTION`` (``legacy_rdzv_port`` takes it out)."""
    if defaults.torchrun_args is None and call_args is None:
        return {}  # nothing to read (torch's option table included)
    found = problems if problems is not None else Problems()
    before = len(found.messages)
    allow = (LEGACY_PORT_OPTION,)
    specs = torchrun.specs if torchrun is not None else known_option_specs()
    step: Dict[str, Any] = {}
    call: Dict[str, Any] = {}
    with found:
        step = parse_options(defaults.torchrun_args, "@torchrun(torchrun_args)", allow=allow, specs=specs)
    with found:
        call = parse_options(call_args, "torchrun_args", allow=allow, specs=specs)
    if problems is None:
        found.raise_all()
    if len(found.messages) > before:
        return {}
    return {**(step or {}), **(call or {})}


def option_names(args: ArgSpec) -> Dict[str, Any]:
    """A dict's option names, whatever their values: an unknown one named beside a refused value."""
    if not isinstance(args, Mapping):
        return {}
    return {canonical_option(k): True for k in args if isinstance(k, str) and k.strip("-")}


def legacy_rdzv_port(options: Dict[str, Any], where: str) -> Tuple[Optional[int], List[str]]:
    """0.2's ``master_port`` taken out of ``options`` (what ``@torchrun(rdzv_port=N)`` pins here): the
    port and its deprecation line."""
    if LEGACY_PORT_OPTION not in options:
        return None, []
    value = options.pop(LEGACY_PORT_OPTION)
    port = parse_port(value if value is not True else "", "%s master_port" % where)
    if port is None:
        raise TorchrunInvalidArgument("%s master_port=%s: give a port number." % (where, shown(value)))
    return port, ["%s master_port=%d is deprecated (metaflow-torchrun 0.2); it pins torchrun's rendezvous port, "
                  "as in 0.2: write @torchrun(rdzv_port=%d). The gang service's port is @torchrun(port=N)."
                  % (where, port, port)]


def none_notes(args: ArgSpec, what: str) -> List[str]:
    keys = keys_given(args, None)
    return [none_note(keys, what)] if keys else []


def none_note(keys: Sequence[str], what: str) -> str:
    return ("%s: None for a bare flag is deprecated (metaflow-torchrun 0.2): %s passed as bare flag%s; write True."
            % (what, ", ".join("--" + k for k in keys), "s" if len(keys) > 1 else ""))


def false_note(keys: Sequence[str]) -> str:
    """``False`` leaves a ``store_true`` flag out, but an option with a value (an ``HfArgumentParser``
    bool) then keeps its default, which may be True: said, not silent."""
    return ("entrypoint_args: False leaves %s out, so the script's default applies, and an option that defaults "
            "to True (an HfArgumentParser bool) stays True: write '%s': 'false' to pass false, or drop the key."
            % (", ".join("--" + k for k in keys), keys[0]))


def function_reference(entrypoint: Any, args: Any) -> Optional[Tuple[functions.FunctionRef, bytes]]:
    """A reference ranks can import, when the entrypoint is a function, and its arguments pickled."""
    if isinstance(entrypoint, (str, os.PathLike)) or not callable(entrypoint):
        return None
    try:
        ref = functions.reference_to(entrypoint)
        functions.split_args(args)
    except (functions.FunctionReferenceError, TypeError) as e:
        raise TorchrunInvalidArgument(str(e)) from None
    return ref, check_picklable(args)


# Keywords older releases' current.torch.run took -> what to do here.
LEGACY_RUN_KEYWORDS = {
    "master_port": ("ports belong to the step: @torchrun(port=N) pins the gang service, @torchrun(rdzv_port=N) "
                    "torchrun's rendezvous (what master_port pinned in 0.1 and 0.2)"),
    "entrypoint_args_raw": "write entrypoint_args=[...]: a list is argv as given",
    **dict.fromkeys(("push_results_dir_to_cloud", "local_output_dir", "cloud_output_dir"),
                    "not provided: save with Metaflow artifacts, @model/@checkpoint or your own code"),
}
RUN_KEYWORDS: Tuple[str, ...] = CallRequest.order
# metaflow-torchrun 0.2's TorchrunSingleNodeMultiGPU().run order: torchrun_args first.
ORDER_0_2: Tuple[str, ...] = ("torchrun_args", "entrypoint", "entrypoint_args", "nproc_per_node")


def call_request(args: Sequence[Any], kwargs: Mapping[str, Any], api: str = "current.torch.run",
                 order: Tuple[str, ...] = RUN_KEYWORDS) -> CallRequest:
    """A call as the user wrote it, whatever its shape (run() takes ``*args, **kwargs``: no bare
    ``TypeError``); what is wrong with its shape is named by ``plan_request`` with the rest.
    ``order``: the positional arguments' (``ORDER_0_2`` for 0.2's single-node launcher)."""
    given: Dict[str, Any] = {}
    problems: List[str] = []
    if len(args) > len(order):
        problems.append("%s takes at most %d positional arguments (%s), not %d: write the others as keywords."
                        % (api, len(order), ", ".join(order), len(args)))
    given.update(zip(order, args))
    unknown: Dict[str, Any] = {}
    for name, value in kwargs.items():
        if name not in order:
            unknown[name] = value
        elif name in given:
            problems.append("%s is given twice: as positional argument %d and as %s=."
                            % (name, order.index(name) + 1, name))
        else:
            given[name] = value
    shape = entrypoint_first(given.get("torchrun_args"), api) if order[:1] == ("torchrun_args",) else None
    if shape:
        problems.append(shape)
        given.pop("torchrun_args")  # said once, here, with what followed it
        given.pop("entrypoint", None)
    elif "entrypoint" not in given and not any(_near_keyword(name) == "entrypoint" for name in unknown):
        problems.append("%s needs an entrypoint: a script path or a module-level function (entrypoint=\"train.py\")."
                        % api)
    return CallRequest(given.get("entrypoint", NO_ENTRYPOINT), given.get("entrypoint_args"),
                       given.get("nproc_per_node"), given.get("torchrun_args"), unknown, api, tuple(problems),
                       tuple(order))


def _near_keyword(name: str) -> Optional[str]:
    close = difflib.get_close_matches(name, RUN_KEYWORDS, n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_keyword(name: str, value: Any, api: str = "current.torch.run",
                    torchrun: Optional[TorchrunOptions] = None) -> str:
    """What to write instead of a keyword run() does not take: 0.1/0.2's reason, or the run() keyword or
    torchrun option (in ``torchrun_args``) it is a near miss of."""
    reason = LEGACY_RUN_KEYWORDS.get(name)
    if reason is not None:
        return "%s does not take %s= (metaflow-torchrun 0.1/0.2): %s." % (api, name, reason)
    hint = did_you_mean(name, RUN_KEYWORDS, "%s=")
    option = None if hint else _near_option(name, torchrun)
    if option in OWNED_OPTIONS:
        hint = " (torchrun's --%s is set by @torchrun: %s)" % (option, OWNED_OPTIONS[option])
    elif option in UNUSABLE_OPTIONS:
        hint = " (torchrun's --%s cannot be used under @torchrun: %s)" % (option, UNUSABLE_OPTIONS[option])
    elif option is not None:
        text = shown(value)
        text = text if len(text) <= 40 else "..."
        hint = " (did you mean torchrun_args={%r: %s}?)" % (option.replace("-", "_"), text)
    written = name if name.isidentifier() else shown(name)  # one line, whatever the name holds
    return "%s does not take %s=%s; it takes %s." % (api, written, hint, ", ".join(RUN_KEYWORDS))


def _near_option(name: str, torchrun: Optional[TorchrunOptions]) -> Optional[str]:
    """The torchrun option a keyword is a near miss of, in torchrun's spelling."""
    options = sorted((torchrun.names if torchrun is not None else known_torchrun_options()) or ())
    close = difflib.get_close_matches(name.replace("_", "-").strip("-"), options, n=1, cutoff=0.6)
    return close[0] if close else None


def legacy_shape(entrypoint: Any, entrypoint_args: Any, api: str = "current.torch.run") -> Optional[str]:
    """0.2's ``run(torchrun_args, entrypoint, ...)``: a dict or list first."""
    if not isinstance(entrypoint, (Mapping, list, tuple)):
        return None
    return ("%s's first argument is the entrypoint, not %s: metaflow-torchrun 0.2 took torchrun_args first "
            "(run(torchrun_args, entrypoint, ...)). Write run(entrypoint=%s, torchrun_args=...) with keywords."
            % (api, shown(entrypoint), shown(entrypoint_args)))


def entrypoint_first(torchrun_args: Any, api: str) -> Optional[str]:
    """``current.torch.run``'s order given to 0.2's single-node launcher (``torchrun_args`` first)."""
    if not (isinstance(torchrun_args, (str, os.PathLike)) or callable(torchrun_args)):
        return None
    return ("%s's first argument is torchrun_args (metaflow-torchrun 0.2's order: run(torchrun_args, entrypoint, "
            "entrypoint_args, nproc_per_node)), not %s. Write run(entrypoint=%s, ...) with keywords."
            % (api, shown(torchrun_args), shown(torchrun_args)))


def plan_request(request: CallRequest, defaults: StepDefaults, search_dirs: Sequence[str]) -> CallPlan:
    """This task's torch, then the call's shape, 0.1/0.2 keywords and arguments: every problem at once."""
    torchrun = require_torch()  # no torch / no torch.distributed / too old: say so now
    problems = Problems()
    for message in request.problems:
        problems.add(message)
    for name, value in request.legacy.items():
        problems.add(unknown_keyword(name, value, request.api, torchrun))
    entrypoint = request.entrypoint
    # (0.2's single-node order takes a mapping first: call_request checked its shape.)
    shape = legacy_shape(entrypoint, request.entrypoint_args, request.api) if request.order == RUN_KEYWORDS else None
    if shape:
        problems.add(shape)
        entrypoint = NO_ENTRYPOINT  # said once, above
    return plan_call(entrypoint, request.entrypoint_args, request.nproc_per_node,
                     request.torchrun_args, defaults, search_dirs, problems, torchrun)


def refuse_torch_restarts(options: Mapping[str, Any], defaults: StepDefaults) -> bool:
    """Whether the call asks torch's own restart (``max_restarts``), refused with the gang's ``restarts``
    or under ``retry_on="infrastructure"`` (torch would rerun a bug)."""
    if "max-restarts" not in options or not restarts_allowed(options):  # most calls pass none
        return False
    if defaults.restarts:
        raise TorchrunInvalidArgument(restarts_clash("torchrun_args", defaults.restarts))
    if defaults.retry_on == "infrastructure":
        raise TorchrunInvalidArgument(retry_on_clash("the call's torchrun_args", options["max-restarts"]))
    return True


def plan_call(entrypoint: Union[str, "os.PathLike[str]", Callable[..., Any]], entrypoint_args: Any,
              nproc_per_node: Any, torchrun_args: ArgSpec, defaults: StepDefaults, search_dirs: Sequence[str],
              problems: Optional[Problems] = None, torchrun: Optional[TorchrunOptions] = None) -> CallPlan:
    """Raises one ``TorchrunInvalidArgument`` naming every problem (with those already in ``problems``)."""
    problems = problems if problems is not None else Problems()
    function: Optional[functions.FunctionRef] = None
    pickled = b""
    script: Optional[str] = None
    entry = EntryArgs([])
    notes: List[str] = []
    rdzv_port: Optional[int] = None
    nproc: Union[int, str, None] = None
    before = len(problems.messages)
    with problems:
        function, pickled = function_reference(entrypoint, entrypoint_args) or (None, b"")  # NO_ENTRYPOINT too
    if function is None and entrypoint is not NO_ENTRYPOINT and len(problems.messages) == before:
        with problems:
            script = resolve_entrypoint(entrypoint, search_dirs)
        with problems:
            entry = entry_arguments(entrypoint_args, defaults.args_as)
        if entry.none_keys:
            notes.append(none_note(entry.none_keys, "entrypoint_args"))
        if entry.false_keys and defaults.args_as != "0.2":
            notes.append(false_note(entry.false_keys))
    options = merged_options(defaults, torchrun_args, problems, torchrun)
    for source, args in (("@torchrun(torchrun_args)", defaults.torchrun_args), ("torchrun_args", torchrun_args)):
        notes.extend(none_notes(args, source))
    with problems:
        rdzv_port, port_notes = legacy_rdzv_port(options, "torchrun_args")
        notes.extend(port_notes)
    with problems:
        check_options(options, torchrun)
    torch_restarts = False
    with problems:
        torch_restarts = refuse_torch_restarts(options, defaults)
    with problems:
        check_command_size(options, os.environ)
    with problems:
        nproc = resolve_nproc(nproc_per_node, options, defaults)
    problems.raise_all()
    options.pop("nproc-per-node", None)  # resolved above, with its precedence
    return CallPlan(
        entry_name=function.qualname if function is not None else os.path.basename(script or ""), script=script,
        entry_argv=entry.argv, function=function, function_args=entrypoint_args, function_pickle=pickled,
        nproc=nproc if nproc is not None else 1, options=options,
        rdzv_port=rdzv_port if rdzv_port is not None else defaults.rdzv_port,
        true_keys=entry.true_keys if defaults.args_as != "0.2" else (), torch_restarts=torch_restarts,
        notes=tuple(notes),
    )
