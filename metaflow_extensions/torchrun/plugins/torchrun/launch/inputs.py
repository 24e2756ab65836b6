"""Bad inputs, refused before anything starts.

Each check raises ``TorchrunInvalidArgument`` with a message that names the
argument and what to do, in the step (or at flow start), never a traceback from
a rank or an operating-system error after the gang has started.
"""

from __future__ import annotations

import importlib.util
import math
import os
import pickle
import stat
import warnings
from typing import Any, Iterable, Mapping, Optional, Tuple

from .command import options_to_argv
from ..errors import TorchrunInvalidArgument, did_you_mean, raise_all, shown

# More processes than this on one node is a typo (a GPU count in the wrong
# unit, an extra zero), not a machine: each rank is a Python process with torch.
MAX_NPROC_PER_NODE = 1024

# A heartbeat is sent every heartbeat_timeout / 10 (at least every 50 ms, at
# most every second): below a few seconds, a busy host or a GC pause reads as a
# frozen node. Nodes of a local run take seconds to start, on a cluster minutes.
MIN_HEARTBEAT_TIMEOUT = 2.0
MIN_START_TIMEOUT = 5.0
MIN_HANG_TIMEOUT = 2.0
# @torchrun(restarts=N): more than this is a loop, not a recovery.
MAX_RESTARTS = 100

# A source file bigger than this is not compiled before the start (a script
# that size is generated, and compiling it would cost every node the time).
MAX_SOURCE_CHECK = 16 * 1024 * 1024

# Linux: one argument or environment string may be at most 32 pages.
MAX_ARG_STRLEN = 32 * 4096
# What @torchrun adds to the command and the environment besides the user's
# options: its own options and variables, with room to spare.
COMMAND_MARGIN = 64 * 1024


def check_nproc_bound(value: int, source: str) -> None:
    if value > MAX_NPROC_PER_NODE:
        raise TorchrunInvalidArgument(
            "%s=%s: nproc_per_node must be at most %d (processes on one node; one per "
            "GPU is usual)." % (source, shown(value), MAX_NPROC_PER_NODE)
        )


def _seconds(value: Any, source: str, minimum: float,
             why: str = "shorter reads a busy node as a dead one") -> float:
    if isinstance(value, bool):
        raise TorchrunInvalidArgument("%s=%s is not a number of seconds." % (source, shown(value)))
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        raise TorchrunInvalidArgument("%s=%s is not a number of seconds." % (source, shown(value))) from None
    if not math.isfinite(seconds):
        raise TorchrunInvalidArgument("%s=%s must be a finite number of seconds." % (source, shown(value)))
    if seconds < minimum:
        raise TorchrunInvalidArgument(
            "%s=%s: must be at least %g seconds (%s)." % (source, shown(value), minimum, why)
        )
    return seconds


def validate_timeouts(heartbeat: Any, start: Any) -> Tuple[float, float]:
    """``@torchrun(heartbeat_timeout, start_timeout)``, checked at flow start."""
    return (
        _seconds(heartbeat, "@torchrun(heartbeat_timeout)", MIN_HEARTBEAT_TIMEOUT),
        _seconds(start, "@torchrun(start_timeout)", MIN_START_TIMEOUT),
    )


def validate_hang_timeout(value: Any) -> Optional[float]:
    """``@torchrun(hang_timeout)``: None (off) or seconds; the gang hears each
    node's silence once a second, so less than two cannot be told apart."""
    if value is None:
        return None
    return _seconds(value, "@torchrun(hang_timeout)", MIN_HANG_TIMEOUT,
                    "the gang hears each node's silence once a second; None turns it off")


def validate_restarts(value: Any, max_restarts: bool) -> int:
    """``@torchrun(restarts=N)``: how many times the gang restarts a call's
    ranks in the same tasks. ``max_restarts``: whether the step's
    ``torchrun_args`` also asks torch's own restart, which both cannot be."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RESTARTS:
        raise TorchrunInvalidArgument(
            "@torchrun(restarts=%s): a whole number of restarts from 0 to %d." % (shown(value), MAX_RESTARTS))
    if value and max_restarts:
        raise TorchrunInvalidArgument(restarts_clash("@torchrun(torchrun_args)", value))
    return value


def restarts_clash(where: str, restarts: int) -> str:
    """``restarts`` (the gang's) and ``max_restarts`` (torch's own) both restart
    the ranks, each in its own way: one of them, never both."""
    return ("@torchrun(restarts=%d) and %s max_restarts both restart the ranks: give one. restarts is the "
            "gang's (every node's ranks restarted together, rank 0 on node 0, not after a Python exception "
            "in your code); max_restarts is torch's own (docs/resume.md)." % (restarts, where))


def step_timeout(specs: Iterable[Tuple[str, Mapping[str, Any]]]) -> Optional[float]:
    """The step's ``@timeout`` in seconds, from its decorators' (name,
    attributes); None without one (or with one Metaflow itself would refuse)."""
    for name, attributes in specs:
        if name != "timeout":
            continue
        try:
            total = sum(float(attributes.get(unit) or 0) * scale
                        for unit, scale in (("seconds", 1), ("minutes", 60), ("hours", 3600)))
        except (TypeError, ValueError):
            return None
        return total if total > 0 and math.isfinite(total) else None
    return None


def validate_shutdown_grace(value: Any, step_timeout: Optional[float]) -> float:
    """``@torchrun(shutdown_grace)``, capped by the step's ``@timeout``: the
    platform stops a task past its timeout whatever grace it was promised."""
    grace = _seconds(value, "@torchrun(shutdown_grace)", 0.0, "0 stops the ranks at once")
    if step_timeout is not None and step_timeout > 0:
        grace = min(grace, float(step_timeout))
    return grace


# -- the entrypoint ----------------------------------------------------------------


def check_path_text(path: str, what: str) -> None:
    """A path the system can be asked about: no NUL (which ends a C string:
    ``os.stat`` raises ``ValueError``) and encodable for the file system (a
    lone surrogate raises ``UnicodeEncodeError``)."""
    if not isinstance(path, str):
        return
    if "\0" in path:
        raise TorchrunInvalidArgument(
            "%s %s contains a NUL character, which no file path can hold." % (what, shown(path[:200]))
        )
    try:
        os.fsencode(path)
    except UnicodeEncodeError as e:
        raise TorchrunInvalidArgument(
            "%s %s cannot be a file path on this system: %s." % (what, shown(path[:200]), e.reason)
        ) from None


def refuse_directory(candidate: str, shown: str) -> None:
    if not os.path.isdir(candidate):
        return
    hint = ""
    if os.path.isfile(os.path.join(candidate, "__main__.py")):
        hint = "; to run its __main__.py, pass %r" % os.path.join(shown, "__main__.py")
    raise TorchrunInvalidArgument(
        "entrypoint %r is a directory (%s), not a Python script%s."
        % (shown, os.path.abspath(candidate), hint)
    )


_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def refuse_special(candidate: str, shown: str) -> None:
    """Something is there, but not a file Python could run: say what it is
    (before, a FIFO or a link to /dev/zero was said not to exist). ``stat``
    does not open it, so a FIFO cannot block the check."""
    try:
        mode = os.stat(candidate).st_mode
    except (OSError, ValueError):  # ValueError: a path no system call takes (check_path_text)
        return
    kind = next((name for test, name in _KINDS if test(mode)), None)
    if kind is None:
        return
    real = os.path.realpath(candidate)
    where = os.path.abspath(candidate) + (" -> %s" % real if real != os.path.abspath(candidate) else "")
    raise TorchrunInvalidArgument(
        "entrypoint %r (%s) is %s, not a Python script: @torchrun runs Python scripts (or functions)."
        % (shown, where, kind)
    )


def check_python_source(path: str, shown: str) -> None:
    """``path`` is something ``python path`` runs: Python source that compiles
    (a SyntaxError is named with its file and line), or a compiled ``.pyc`` or
    a zip application, which Python runs too."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
            if head.startswith(importlib.util.MAGIC_NUMBER) or head.startswith(b"PK\x03\x04"):
                return
            if b"\0" in head:
                raise TorchrunInvalidArgument(
                    "entrypoint %r (%s) is not a Python script: it is a binary file. "
                    "@torchrun runs Python scripts (or functions)." % (shown, path)
                )
            if os.fstat(f.fileno()).st_size > MAX_SOURCE_CHECK:
                return
            source = head + f.read()
    except OSError as e:
        raise TorchrunInvalidArgument(
            "entrypoint %r (%s) cannot be read: %s." % (shown, path, e.strerror or e)
        ) from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the ranks show the script's warnings
            compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as e:
        line = (e.text or "").strip()
        raise TorchrunInvalidArgument(
            "entrypoint %r is not valid Python: %s (%s, line %s)%s. @torchrun runs Python "
            "scripts (or functions)."
            % (shown, e.msg, e.filename or path, e.lineno, (": %s" % line[:200]) if line else "")
        ) from None
    except ValueError as e:  # null bytes past the first block
        raise TorchrunInvalidArgument(
            "entrypoint %r (%s) is not a Python script: %s." % (shown, path, e)
        ) from None
    except (RecursionError, MemoryError):
        return  # too deep to check here; the ranks will say


# -- arguments -----------------------------------------------------------------------


def check_arguments(argv: Iterable[str], what: str = "entrypoint_args") -> None:
    """What no command line can hold is refused, as ``python script.py`` would."""
    for i, token in enumerate(argv):
        if "\0" in token:
            raise TorchrunInvalidArgument(
                "%s: item %d (%s) contains a NUL character, which no command-line "
                "argument can hold." % (what, i, shown(token[:80]))
            )


def _encoded(token: str, what: str) -> bytes:
    try:
        return os.fsencode(token)
    except UnicodeEncodeError as e:
        raise TorchrunInvalidArgument("%s: %s cannot be encoded for the command line: %s" % (what, shown(token[:80]), e)) from None


def check_command_size(options: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    """torchrun's command line (its options; the script's arguments travel in
    a file) and the environment fit what ``exec`` accepts."""
    argv = options_to_argv(options)
    total = COMMAND_MARGIN
    for token in argv:
        if "\0" in token:
            raise TorchrunInvalidArgument(
                "torchrun_args: %r contains a NUL character, which no command-line "
                "argument can hold." % token[:80]
            )
        size = len(_encoded(token, "torchrun_args")) + 1
        if size > MAX_ARG_STRLEN:
            raise TorchrunInvalidArgument(
                "torchrun_args: one value is %d bytes; the system takes at most %d in one "
                "command-line argument." % (size, MAX_ARG_STRLEN)
            )
        total += size + 8  # the pointer to it
    for key, value in environ.items():
        size = len(os.fsencode(key)) + len(os.fsencode(value)) + 2
        if size > MAX_ARG_STRLEN:
            raise TorchrunInvalidArgument(
                "the environment variable %s is %d bytes; the system passes at most %d in one "
                "variable to a new process (torchrun)." % (key, size, MAX_ARG_STRLEN)
            )
        total += size + 8
    limit = arg_max()
    if total > limit:
        raise TorchrunInvalidArgument(
            "torchrun_args: torchrun's command line and environment would take about %d "
            "bytes, more than this system accepts (%d)." % (total, limit)
        )


def arg_max() -> int:
    try:
        value = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError, AttributeError):
        value = -1
    return value if value and value > 0 else 128 * 1024


def check_picklable(args: Any) -> None:
    """A function entrypoint's arguments reach the ranks by pickle."""
    try:
        pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise TorchrunInvalidArgument(
            "entrypoint_args cannot be pickled for the ranks: %s: %s. Pass small picklable "
            "values (numbers, strings, paths, plain containers); big data belongs in files "
            "or Metaflow artifacts." % (type(e).__name__, e)
        ) from None


def validate_args_as(value: Any, source: str) -> str:
    """``args_as``: how a dict of entrypoint_args is spelled. ``"0.2"`` is
    metaflow-torchrun 0.2's JSON spelling (``True`` -> ``--k true``), opt-in."""
    text = "ours" if value is None else str(value).strip()
    if text not in ("ours", "0.2"):
        raise TorchrunInvalidArgument(
            "%s=%s: give \"0.2\" (metaflow-torchrun 0.2's spelling: --k true, --k [1, 2]) or "
            "leave it out (True is a bare --k, a list is --k a b)." % (source, shown(value))
        )
    return text


# Keywords older releases' current.torch.run took -> what to do here.
LEGACY_RUN_KEYWORDS = {
    "master_port": (
        "ports belong to the step: @torchrun(port=N) pins the gang service, "
        "@torchrun(rdzv_port=N) torchrun's rendezvous (what master_port pinned in 0.1 and 0.2)"
    ),
    "entrypoint_args_raw": "write entrypoint_args=[...]: a list is argv as given",
    "push_results_dir_to_cloud": "not provided: save with Metaflow artifacts, @model/@checkpoint or your own code",
    "local_output_dir": "not provided: save with Metaflow artifacts, @model/@checkpoint or your own code",
    "cloud_output_dir": "not provided: save with Metaflow artifacts, @model/@checkpoint or your own code",
}
RUN_KEYWORDS = ("entrypoint", "entrypoint_args", "nproc_per_node", "torchrun_args")


def refuse_legacy_call(entrypoint: Any, entrypoint_args: Any, extra: Mapping[str, Any]) -> None:
    """Calls written for metaflow-torchrun 0.1/0.2 that cannot mean the same
    here, refused with what to write instead (not a bare ``TypeError``)."""
    problems = []
    for name in extra:
        reason = LEGACY_RUN_KEYWORDS.get(name)
        if reason is not None:
            problems.append("current.torch.run does not take %s= (metaflow-torchrun 0.1/0.2): %s." % (name, reason))
        else:
            problems.append("current.torch.run does not take %s=%s; it takes %s."
                            % (name, did_you_mean(name, RUN_KEYWORDS, "%s="), ", ".join(RUN_KEYWORDS)))
    if isinstance(entrypoint, (Mapping, list, tuple)):
        problems.append(
            "current.torch.run's first argument is the entrypoint, not %s: metaflow-torchrun 0.2 took "
            "torchrun_args first (run(torchrun_args, entrypoint, ...)). Write run(entrypoint=%s, "
            "torchrun_args=...) with keywords." % (shown(entrypoint), shown(entrypoint_args))
        )
    if problems:
        raise_all(problems)
