"""@torchrun's knobs (``METAFLOW_TORCHRUN_*``) as Metaflow's configuration has them.

``config/mfextinit_torchrun.py`` declares them with Metaflow's ``from_conf``: the
environment wins, else the Metaflow profile. The task reads them here, once, at
the step's start; the layers below take plain values or plain environment
variables (``procs/`` and ``host/`` run inside ranks, with no Metaflow).
"""

from __future__ import annotations

import os
from typing import Dict, Mapping, MutableMapping, Optional

from .host import log
from .procs.names import DEBUG_ENV, SECRET_ENV, USER_KNOBS, conf_key


def profile_value(env_name: str) -> Optional[str]:
    """The knob's value from Metaflow's configuration (environment, then profile)."""
    from metaflow import metaflow_config

    value = getattr(metaflow_config, conf_key(env_name), None)
    return None if value is None else str(value)


def knob_environ(env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """``env`` (the process's), completed with each knob that only the Metaflow
    profile sets: what every reader of a knob in this task is given."""
    out = dict(os.environ if env is None else env)
    for name in USER_KNOBS:
        if name not in out:
            value = profile_value(name)
            if value is not None:
                out[name] = value
    return out


def export_knobs(environ: MutableMapping[str, str] = os.environ) -> None:
    """Put the profile's knobs in this task's environment, where the gang, the
    work directories and Metaflow's local worker nodes read them. Not the secret:
    that is handed to the gang alone (``gang/secret.py``), never inherited by the
    ranks."""
    for name, value in knob_environ(environ).items():
        if name in USER_KNOBS and name != SECRET_ENV:
            environ.setdefault(name, value)
    log.configure(environ.get(DEBUG_ENV))  # the debug channel, if asked for
