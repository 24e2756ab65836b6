"""What the user wrote in ``@torchrun(...)`` and Metaflow's configuration, read once, at ``step_init``:
every attribute checked against the step's other decorators and the graph, each problem kept, so a
flow is refused once, naming all of them, before any task starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from .base import defaults as DEFAULTS
from .base.knobs import USER_KNOBS, Knobs, conf_key, read_knobs, says_off
from .errors import Problems, TorchrunInvalidArgument
from .gang.preflight_modes import DEFAULT_MODE as DEFAULT_PREFLIGHT
from .gang.preflight_modes import parse_mode as parse_preflight
from .gang import parse_port
from .launch import (NO_ACCELERATORS, Accelerators, ArgSpec, StepDefaults, merged_options, requested_accelerators,
                     step_timeout, validate_args_as, validate_shutdown_grace, validate_timeouts)
from .launch.command import restarts_allowed
from .launch.inputs import (retry_on_clash, validate_hang_timeout, validate_restarts, validate_retry_on,
                            validate_snapshot_memory, validate_snapshots, validate_spares, validate_min_nodes,
                            validate_swap_stragglers)
from .launch.plan import check_options, legacy_rdzv_port, none_notes, option_names, validate_nproc
from .launch.platforms import check_port_clash, refuse_one_node_on_kubernetes, refuse_step_functions

# @torchrun's attributes and their defaults (TorchrunDecorator's docstring documents each).
ATTRIBUTE_DEFAULTS: Mapping[str, Any] = DEFAULTS.ATTRIBUTES

# (name, attributes) of each decorator on the step, as Metaflow lists them.
DecoratorSpecs = Sequence[Tuple[str, Mapping[str, Any]]]


@dataclass(frozen=True)
class StepSpec:
    attributes: Mapping[str, Any]
    torchrun_args: ArgSpec = None  # 0.2's spellings translated
    accelerators: Accelerators = NO_ACCELERATORS
    port: Optional[int] = None
    rdzv_port: Optional[int] = None
    hang_timeout: Optional[float] = DEFAULTS.HANG_TIMEOUT
    shutdown_grace: float = DEFAULTS.SHUTDOWN_GRACE
    args_as: str = DEFAULTS.ARGS_AS
    preflight: str = DEFAULT_PREFLIGHT
    retry_on: Any = None
    restarts: int = DEFAULTS.RESTARTS
    spares: int = DEFAULTS.SPARES
    min_nodes: Optional[int] = DEFAULTS.MIN_NODES
    regrow: bool = DEFAULTS.REGROW
    swap_stragglers: Optional[float] = DEFAULTS.SWAP_STRAGGLERS
    snapshot_every: Optional[int] = None
    snapshot_memory: Optional[float] = None
    runs_here: bool = True  # no remote compute decorator: a local run's tasks run on this host
    # Deprecation lines for 0.2's spellings in torchrun_args: said once, by the launcher.
    notes: Tuple[str, ...] = ()


def read_step_spec(attributes: Mapping[str, Any], decorators: DecoratorSpecs, entries: Sequence[str],
                   argv: Sequence[str], problems: Problems) -> StepSpec:
    """Each problem kept in ``problems`` (the caller raises them all at once). ``entries``: the
    ``num_parallel`` of each step that leads here."""
    nproc = attributes.get("nproc_per_node")
    if nproc is not None:
        problems.check(validate_nproc, nproc, "@torchrun(nproc_per_node)")
    torchrun_args, legacy_port, notes, torch_restarts = _torchrun_args(attributes.get("torchrun_args"), problems)
    retry_on = problems.check(validate_retry_on, attributes.get("retry_on"))
    problems.check(refuse_torch_restarts_for_bugs, retry_on, torch_restarts)
    accelerators = problems.check(requested_accelerators, decorators) or NO_ACCELERATORS
    port = problems.check(parse_port, attributes.get("port"), "@torchrun(port)")
    rdzv_port = problems.check(pinned_rdzv_port, attributes.get("rdzv_port"), legacy_port, port)
    source = "@torchrun(rdzv_port)" if attributes.get("rdzv_port") is not None else "master_port"
    problems.check(check_port_clash, decorators, port, rdzv_port, source)
    problems.check(refuse_step_functions, list(argv))
    problems.check(refuse_one_node_on_kubernetes, decorators, list(entries))
    problems.check(validate_timeouts, attributes.get("heartbeat_timeout"), attributes.get("start_timeout"))
    restarts = problems.check(validate_restarts, attributes.get("restarts"), bool(torch_restarts))
    hang_timeout = problems.check(validate_hang_timeout, attributes.get("hang_timeout"))
    grace = problems.check(validate_shutdown_grace, attributes.get("shutdown_grace"), step_timeout(decorators))
    return StepSpec(
        attributes=attributes, torchrun_args=torchrun_args, accelerators=accelerators, port=port, rdzv_port=rdzv_port,
        hang_timeout=hang_timeout, shutdown_grace=DEFAULTS.SHUTDOWN_GRACE if grace is None else grace,
        args_as=problems.check(validate_args_as, attributes.get("args_as"), "@torchrun(args_as)") or DEFAULTS.ARGS_AS,
        preflight=problems.check(preflight_mode, attributes.get("preflight")) or DEFAULT_PREFLIGHT,
        retry_on=retry_on, restarts=restarts or 0,
        spares=problems.check(validate_spares, attributes.get("spares"), restarts, list(entries)) or 0,
        min_nodes=problems.check(validate_min_nodes, attributes.get("min_nodes"), restarts, attributes.get("spares"),
                                 list(entries), decorators),
        regrow=truthy(attributes.get("regrow", DEFAULTS.REGROW)),
        swap_stragglers=problems.check(validate_swap_stragglers, attributes.get("swap_stragglers"),
                                       attributes.get("spares"), restarts),
        snapshot_every=problems.check(validate_snapshots, attributes.get("snapshots"), restarts),
        snapshot_memory=problems.check(validate_snapshot_memory, attributes.get("snapshot_memory")),
        notes=tuple(notes), runs_here=not any(name in REMOTE_COMPUTE for name, _ in decorators),
    )


def refuse_torch_restarts_for_bugs(retry_on: Optional[str], torch_restarts: Optional[str]) -> None:
    """torch's ``max_restarts`` reruns the ranks after a bug of the user's code too, which
    ``retry_on="infrastructure"`` asks never to happen (the gang's ``restarts=N`` tells them apart)."""
    if retry_on == "infrastructure" and torch_restarts:
        raise TorchrunInvalidArgument(retry_on_clash("torchrun_args", torch_restarts))


# Step decorators that run a task elsewhere than the runtime's host.
REMOTE_COMPUTE = ("kubernetes", "batch", "slurm", "nvidia", "nvct", "snowpark")


def _torchrun_args(args: ArgSpec, problems: Problems) -> Tuple[ArgSpec, Optional[int], list, Optional[str]]:
    """The step's torchrun_args parsed, 0.2's ``master_port`` taken out (the pinned port), the deprecation
    lines for its spellings, and torch's own ``max_restarts`` they ask, if any."""
    if args is None:
        return None, None, [], None
    options = problems.check(merged_options, StepDefaults(torchrun_args=args), None)
    torch_restarts = str(options["max-restarts"]).strip() if options and restarts_allowed(options) else None
    pinned = problems.check(legacy_rdzv_port, options, "@torchrun(torchrun_args)") if options else None
    legacy_port, notes, parsed = None, [], args
    if pinned is not None:
        legacy_port, notes = pinned
        notes = notes + none_notes(args, "@torchrun(torchrun_args)")
        parsed = options
    # Names torchrun does not know, also where a value was refused.
    problems.check(check_options, options if options is not None else option_names(args))
    return parsed, legacy_port, notes, torch_restarts


def pinned_rdzv_port(value: Any, legacy_port: Optional[int], port: Optional[int]) -> Optional[int]:
    """``rdzv_port``, or 0.2's ``master_port`` in ``torchrun_args``; never the gang service's port."""
    rdzv = parse_port(value, "@torchrun(rdzv_port)")
    if legacy_port is not None and rdzv is not None and legacy_port != rdzv:
        raise TorchrunInvalidArgument(
            "@torchrun(rdzv_port=%d) and torchrun_args master_port=%d: both pin torchrun's "
            "rendezvous port; give only rdzv_port." % (rdzv, legacy_port))
    rdzv = rdzv if rdzv is not None else legacy_port
    if rdzv is not None and rdzv == port:
        raise TorchrunInvalidArgument(
            "@torchrun(port=%d, rdzv_port=%d): the gang service and torchrun's rendezvous "
            "both listen on the control node and need two ports." % (rdzv, rdzv))
    return rdzv


def preflight_mode(value: Any) -> str:
    try:
        return parse_preflight(value)
    except ValueError as e:
        raise TorchrunInvalidArgument(str(e)) from None


def truthy(value: Any) -> bool:
    """An attribute's on/off, also as a flag on Metaflow's command line spells it."""
    return not says_off(value) if isinstance(value, str) else bool(value)


def step_defaults(spec: StepSpec, knobs: Optional[Knobs] = None) -> StepDefaults:
    """What every call of the step starts from (call arguments override it)."""
    attributes = spec.attributes
    return StepDefaults(
        nproc_per_node=attributes.get("nproc_per_node"), derived_nproc=spec.accelerators.nproc,
        accelerators=spec.accelerators, torchrun_args=spec.torchrun_args, args_as=spec.args_as,
        port=spec.port, rdzv_port=spec.rdzv_port, label_logs=truthy(attributes["label_logs"]),
        heartbeat_timeout=float(attributes["heartbeat_timeout"]), start_timeout=float(attributes["start_timeout"]),
        hang_timeout=spec.hang_timeout, shutdown_grace=spec.shutdown_grace, preflight=spec.preflight,
        restarts=spec.restarts, spares=spec.spares, retry_on=spec.retry_on, knobs=knobs or Knobs(),
        snapshot_every=spec.snapshot_every, snapshot_memory=spec.snapshot_memory, min_nodes=spec.min_nodes,
        regrow=spec.regrow, swap_stragglers=spec.swap_stragglers,
    )


def read_settings(env: Optional[Mapping[str, str]] = None) -> Tuple[Knobs, List[str]]:
    """The step's settings from ``env`` (the process's), else the Metaflow profile; a message per refusal."""
    from metaflow import metaflow_config

    out = dict(os.environ if env is None else env)
    for name in USER_KNOBS:
        value = getattr(metaflow_config, conf_key(name), None)
        if name not in out and value is not None:
            out[name] = str(value)
    return read_knobs(out)
