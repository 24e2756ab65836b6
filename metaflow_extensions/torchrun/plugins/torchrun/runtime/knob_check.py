"""Every knob of Metaflow's configuration (``METAFLOW_TORCHRUN_*``) checked at
the step's start, each by its own reader run strictly.

The readers fall back to the default where no one could be told (a rank, a
prune in the background); a value they could only misread (a word where a
number is due, a negative count, a typo for "off") is refused here instead,
before anything starts, with every such knob named at once and what it takes.
"""

from __future__ import annotations

import functools
from typing import Callable, Dict, List, Mapping

from .. import knob_text
from ..errors import TorchrunInvalidArgument
from ..gang import parse_port
from ..gang import secret as gang_secret
from ..host import retention_policy
from ..launch import flight_entries
from ..procs import (DEBUG_ENV, FLIGHT_RECORDER_ENV, KEEP_LOGS_ENV, KEEP_LOGS_HOURS_ENV, MAX_LOG_MB_ENV,
                     NODE_HISTORY_ENV, PORT_ENV)
from . import node_history
from .session import progress_interval, straggler_ratio, straggler_seconds
from .warm_start import warm_start


def _only(env: Mapping[str, str], name: str) -> Dict[str, str]:
    return {name: env[name]} if name in env else {}


def knob_problems(env: Mapping[str, str]) -> List[str]:
    """What is wrong with the knobs in ``env``, one message a knob."""
    readers: List[Callable[[], object]] = [
        lambda: parse_port(env.get(PORT_ENV), PORT_ENV),
        lambda: gang_secret.from_environment(env),
        lambda: progress_interval(env, strict=True),
        lambda: straggler_ratio(env, strict=True),
        lambda: straggler_seconds(env, strict=True),
        lambda: knob_text.switch(DEBUG_ENV, env.get(DEBUG_ENV), strict=True),
        lambda: node_history.parse_threshold(env.get(NODE_HISTORY_ENV)),
        lambda: node_history.history_runs(env, strict=True),
        lambda: flight_entries(env.get(FLIGHT_RECORDER_ENV), strict=True),
        lambda: warm_start(env, strict=True),
    ]
    # The retention knobs one at a time: each is named, not only the first.
    for name in (KEEP_LOGS_HOURS_ENV, KEEP_LOGS_ENV, MAX_LOG_MB_ENV):
        readers.append(functools.partial(retention_policy, _only(env, name), strict=True))
    problems = []
    for read in readers:
        try:
            read()
        except (ValueError, TorchrunInvalidArgument) as e:  # a KnobError, the secret's own, a port's
            problems.append(str(e))
    return problems
