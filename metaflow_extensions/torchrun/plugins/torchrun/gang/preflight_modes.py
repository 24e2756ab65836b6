"""``@torchrun(preflight=...)``'s modes, read at ``step_init`` by Metaflow's runtime: apart from
the preflight itself (node_compare.py), which loads the gang's messages and the ranks' records
that the runtime never needs.

The default checks versions and each node's fitness (no process, on the join's thread); "full"
adds a collective job before the first call; "strict" refuses a host with a bad history rather
than warn.
"""

from __future__ import annotations

from typing import Any

from ..base import defaults as DEFAULTS
from ..base import knobs

VERSIONS = "versions"
FULL = "full"
STRICT = "strict"
OFF = "off"
DEFAULT_MODE = DEFAULTS.PREFLIGHT  # VERSIONS


def parse_mode(value: Any) -> str:
    """False, "off" and None say none; anything unknown is refused by name."""
    if value is None or value is False or (isinstance(value, str) and knobs.says_off(value)):
        return OFF
    if value is True:
        return DEFAULT_MODE
    if isinstance(value, str) and value.strip().lower() in (VERSIONS, FULL, STRICT):
        return value.strip().lower()
    raise ValueError("@torchrun(preflight=%r): use \"versions\" (the default), \"full\", \"strict\" or False."
                     % (value,))
