"""@torchrun's settings (``METAFLOW_TORCHRUN_*``) as Metaflow's configuration has them.

``config/mfextinit_torchrun.py`` declares them with Metaflow's ``from_conf``: the
environment wins, else the Metaflow profile. The step's start reads them here,
once, into ``knobs.Knobs``, which the layers below are handed (``procs/`` and
``host/`` run inside ranks, with no Metaflow).
"""

from __future__ import annotations

import os
from typing import Dict, List, Mapping, Optional, Tuple

from .knobs import USER_KNOBS, Knobs, conf_key, read_knobs


def profile_value(env_name: str) -> Optional[str]:
    """The setting's value from Metaflow's configuration (environment, then profile)."""
    from metaflow import metaflow_config

    value = getattr(metaflow_config, conf_key(env_name), None)
    return None if value is None else str(value)


def knob_environ(env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """``env`` (the process's), completed with each setting that only the Metaflow profile sets."""
    out = dict(os.environ if env is None else env)
    for name in USER_KNOBS:
        if name not in out:
            value = profile_value(name)
            if value is not None:
                out[name] = value
    return out


def step_knobs(env: Optional[Mapping[str, str]] = None) -> Tuple[Knobs, List[str]]:
    """The step's settings, and one message for each refused (``knobs.read_knobs``)."""
    return read_knobs(knob_environ(env))
