"""@torchrun's settings from Metaflow's configuration (``METAFLOW_TORCHRUN_*``), read
once, strictly, into ``Knobs`` at the step's start: a value that could only be misread
(a word for a number, a typo for "off") refuses the step, named with what it takes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from . import defaults as DEFAULTS

# -- the names users set (docs/configuration.md) ----------------------------------
# Read through Metaflow's configuration, so a profile can set them too (``conf_key``).
PORT_ENV = "METAFLOW_TORCHRUN_PORT"  # the gang service's port on a local run
SECRET_ENV = "METAFLOW_TORCHRUN_SECRET"  # the gang's secret, instead of a stored one
PROGRESS_ENV = "METAFLOW_TORCHRUN_PROGRESS_SECONDS"
STRAGGLER_RATIO_ENV = "METAFLOW_TORCHRUN_STRAGGLER_RATIO"
STRAGGLER_SECONDS_ENV = "METAFLOW_TORCHRUN_STRAGGLER_SECONDS"
KEEP_LOGS_HOURS_ENV = "METAFLOW_TORCHRUN_KEEP_LOGS_HOURS"
KEEP_LOGS_ENV = "METAFLOW_TORCHRUN_KEEP_LOGS"
MAX_LOG_MB_ENV = "METAFLOW_TORCHRUN_MAX_LOG_MB"
DEBUG_ENV = "METAFLOW_TORCHRUN_DEBUG"  # "1": the debug channel on stderr (host/log.py)
NODE_HISTORY_ENV = "METAFLOW_TORCHRUN_NODE_HISTORY"  # "K/M" (record/node_history.py), or "off"
NODE_HISTORY_RUNS_ENV = "METAFLOW_TORCHRUN_NODE_HISTORY_RUNS"
FLIGHT_RECORDER_ENV = "METAFLOW_TORCHRUN_FLIGHT_RECORDER"  # entries; "off" or 0: none, nobody asked
WARM_START_ENV = "METAFLOW_TORCHRUN_WARM_START"  # "off": ranks and agent start fresh, not forked
TRAINER_PROGRESS_ENV = "METAFLOW_TORCHRUN_TRAINER_PROGRESS"  # "0": no Trainer reports progress
ARRIVALS_ENV = "METAFLOW_TORCHRUN_ARRIVALS"  # "0": no rank reads when it reached its collectives
# Tests only: host names by node index (several local "nodes" share a host; host/network.py).
TEST_HOSTS_ENV = "METAFLOW_TORCHRUN_TEST_HOSTS"

_CONF_PREFIX = "METAFLOW_"


def conf_key(env_name: str) -> str:
    """The name Metaflow's ``from_conf`` takes (it adds ``METAFLOW_`` itself)."""
    return env_name[len(_CONF_PREFIX):] if env_name.startswith(_CONF_PREFIX) else env_name


# -- what a setting's text means --------------------------------------------------
OFF_WORDS = ("off", "false", "no", "none")
ON_WORDS = ("1", "true", "yes", "on")
MIN_SECRET_BYTES = 16  # gang/auth.py signs with it
MAX_WINDOW = 100  # the most appearances of a host the node history weighs


class KnobError(ValueError):
    """A setting's value, named, with what the setting takes."""


def says_off(text: Optional[str]) -> bool:
    """Off as a switch reads it: ``OFF_WORDS``, 0, or nothing at all."""
    return (text or "").strip().lower() in OFF_WORDS + ("0", "")


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "...")


def number(name: str, text: str, low: float = 0.0, above: bool = False, whole: bool = False) -> float:
    raw = text.strip()
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    readable = math.isfinite(value) and (not whole or value == int(value))
    if not (readable and (value > low if above else value >= low)):
        raise KnobError("%s=%s: give %s %s %g" % (
            name, _shown(raw), "a whole number" if whole else "a number", "above" if above else "of at least", low))
    return int(value) if whole else value


def count_or_off(name: str, text: str) -> int:
    """A whole number of at least 0, or "off" (0)."""
    if text.strip().lower() in OFF_WORDS:
        return 0
    try:
        return int(number(name, text, whole=True))
    except KnobError:
        raise KnobError("%s=%s: give a whole number of at least 0, or off" % (name, _shown(text.strip()))) from None


def switch(name: str, text: str) -> bool:
    """On (``ON_WORDS``) or off (0 or ``OFF_WORDS``)."""
    if text.strip().lower() in ON_WORDS:
        return True
    if not says_off(text):
        raise KnobError("%s=%s: give 1 (or true, yes, on) or 0 (or false, no, off)" % (
            name, _shown(text.strip().lower())))
    return False


def threshold(name: str, text: str) -> Optional[Tuple[int, int]]:
    """``"K/M"`` (a host blamed in K of its last M appearances is flagged); None for "off"."""
    if says_off(text):
        return None
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)) <= MAX_WINDOW:
        raise KnobError("%s=%r: give K/M (a host blamed in K of its last M appearances is flagged, "
                        "1 <= K <= M <= %d), or off" % (name, text[:40], MAX_WINDOW))
    return int(match.group(1)), int(match.group(2))


def port(name: str, text: str) -> Optional[int]:
    """A port; Metaflow writes the string "None" for no port."""
    if text.strip().lower() == "none":
        return None
    if not (text.strip().isdigit() and text.isascii() and 0 < int(text) < 65536):
        raise KnobError("%s=%s: give a port number, 1-65535" % (name, _shown(text.strip())))
    return int(text)


def secret(name: str, text: str) -> bytes:
    """The user's own gang secret, never shown: too short is an error, never a silent fallback."""
    data = text.encode()
    if len(data) < MIN_SECRET_BYTES:
        raise KnobError("%s is set but shorter than %d bytes: use a longer random value "
                        "(e.g. python -c 'import secrets; print(secrets.token_hex(32))')" % (name, MIN_SECRET_BYTES))
    return data


@dataclass(frozen=True)
class Knobs:
    """Every setting as the step's start read it; an unset or blank one is its default."""

    port: Optional[int] = None
    secret: Optional[bytes] = field(default=None, repr=False)
    progress_seconds: float = DEFAULTS.PROGRESS_SECONDS
    straggler_ratio: float = DEFAULTS.STRAGGLER_RATIO
    straggler_seconds: float = DEFAULTS.STRAGGLER_SECONDS
    keep_logs_hours: float = DEFAULTS.KEEP_LOGS_HOURS
    keep_logs: int = DEFAULTS.KEEP_LOGS
    max_log_mb: float = DEFAULTS.MAX_LOG_MB
    debug: bool = False
    node_history: Optional[Tuple[int, int]] = (DEFAULTS.NODE_HISTORY_CULPRIT, DEFAULTS.NODE_HISTORY_APPEARANCES)
    node_history_runs: int = DEFAULTS.NODE_HISTORY_RUNS
    flight_recorder: int = DEFAULTS.FLIGHT_RECORDER_ENTRIES
    warm_start: bool = True
    trainer_progress: bool = True
    arrivals: bool = True


def _at_least(low: float, above: bool = False, whole: bool = False) -> Callable[[str, str], object]:
    return lambda name, text: number(name, text, low, above=above, whole=whole)


# Each field's variable, and what reads its text (KnobError: refused).
_READERS: Tuple[Tuple[str, str, Callable[[str, str], object]], ...] = (
    ("port", PORT_ENV, port),
    ("secret", SECRET_ENV, secret),
    ("progress_seconds", PROGRESS_ENV, _at_least(0.5)),
    # At least 1.01: a ratio of 1 would name every node slower than the median.
    ("straggler_ratio", STRAGGLER_RATIO_ENV, lambda name, text: max(1.01, number(name, text, 1.0, above=True))),
    ("straggler_seconds", STRAGGLER_SECONDS_ENV, _at_least(0)),
    ("keep_logs_hours", KEEP_LOGS_HOURS_ENV, _at_least(0)),
    ("keep_logs", KEEP_LOGS_ENV, _at_least(0, whole=True)),
    ("max_log_mb", MAX_LOG_MB_ENV, _at_least(0)),
    ("debug", DEBUG_ENV, switch),
    ("node_history", NODE_HISTORY_ENV, threshold),
    ("node_history_runs", NODE_HISTORY_RUNS_ENV, _at_least(0, whole=True)),
    ("flight_recorder", FLIGHT_RECORDER_ENV, count_or_off),
    ("warm_start", WARM_START_ENV, switch),
    ("trainer_progress", TRAINER_PROGRESS_ENV, switch),
    ("arrivals", ARRIVALS_ENV, switch),
)


def read_knobs(env: Mapping[str, str]) -> Tuple[Knobs, List[str]]:
    """Every setting in ``env``, and one message for each refused (its default in the record)."""
    values: Dict[str, object] = {}
    problems = []
    for attribute, name, read in _READERS:
        text = env.get(name)
        if text is None or not text.strip():
            continue
        try:
            values[attribute] = read(name, text)
        except KnobError as e:
            problems.append(str(e))
    return Knobs(**values), problems  # type: ignore[arg-type]


USER_KNOBS = tuple(name for _, name, _ in _READERS)
