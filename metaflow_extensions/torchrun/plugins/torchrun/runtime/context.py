"""The step as this node runs it, fixed once (``StepContext``): who the gang is, the step's
settings, where this node sits, the route and directory its calls use, its warm process,
its card's hooks and its preflight's. Built by ``step_context`` at the one point where all
of it is known, the start of the step's code (a local run's control sets the topology only
as it starts its nodes), and read, never written, by the session and every call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Tuple, Union

from ..gang.gang_progress import ProgressRecord
from ..gang.identity import GangIdentity
from ..gang.topology import Topology
from ..host.basedir import base_dir
from ..host.network import route_to
from ..launch import StepDefaults
from . import preflight
from .warm_start import WarmStart

Secret = Union[bytes, Callable[[], bytes]]  # bytes on the control; a function that fetches it elsewhere


@dataclass(frozen=True)
class CardHooks:
    """The step's card as the call code sees it: the command that opens it (said with a failure's
    logs) and, on the control of a step with a card, the live refresh of its progress section."""

    hint: Optional[str] = None
    refresh: Optional[Callable[[ProgressRecord], None]] = None


@dataclass(frozen=True)
class StepContext:
    identity: GangIdentity
    defaults: StepDefaults
    topology: Topology
    secret: Secret
    flow_dir: Optional[str] = None
    # Found once as the step starts, for every call: the address (and interface) other nodes reach this
    # node at, and the host's private base directory (None: each call tries again and says why it cannot).
    route: Tuple[str, Optional[str]] = ("", None)
    host_base: Optional[str] = None
    warm: Optional[WarmStart] = None  # the step's warm process; closed with the session
    card: CardHooks = field(default_factory=CardHooks)
    preflight: preflight.Hooks = field(default_factory=preflight.Hooks)
    notes_key: str = ""  # a plan's notes are said once per key (the gang, or 0.2's launcher's task)

    @property
    def is_control(self) -> bool:
        return self.topology.is_control

    @property
    def node_index(self) -> int:
        return self.topology.node_index


def step_context(identity: GangIdentity, defaults: StepDefaults, topology: Topology, secret: Secret, *,
                 flow_dir: Optional[str] = None, warm: Optional[WarmStart] = None, card: Optional[CardHooks] = None,
                 history: Optional[preflight.History] = None, notes_key: Optional[str] = None) -> StepContext:
    """The context, with what the host tells now: the route, the base directory, and the step's warm
    process started (importing torch while the gang forms) unless a local control started its own."""
    route = route_to(topology.main_addr, topology.is_local)
    try:
        host_base: Optional[str] = base_dir()
    except OSError:
        host_base = None
    if warm is None:
        warm = WarmStart.started_for_step(defaults)
    return StepContext(identity=identity, defaults=defaults, topology=topology, secret=secret, flow_dir=flow_dir,
                       route=route, host_base=host_base, warm=warm, card=card or CardHooks(),
                       preflight=preflight.hooks(defaults, topology, route, history),
                       notes_key=identity.gang_id if notes_key is None else notes_key)
