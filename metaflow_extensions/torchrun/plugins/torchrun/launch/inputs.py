"""Bad inputs refused before anything starts: a ``TorchrunInvalidArgument`` naming the argument and what
to do, never a traceback from a rank or an operating-system error after the gang has started."""

from __future__ import annotations

import importlib.util
import itertools
import math
import os
import pickle
import stat
import warnings
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..base import defaults as DEFAULTS
from ..gang.messages import MAX_NODE
from ..errors import TorchrunInvalidArgument, did_you_mean, shown

# Below these a busy host or a GC pause reads as a frozen node (a heartbeat goes every heartbeat_timeout / 10).
MIN_HEARTBEAT_TIMEOUT = 2.0
MIN_START_TIMEOUT = 5.0
MIN_HANG_TIMEOUT = 2.0
# @torchrun(restarts=N): more than this is a loop, not a recovery.
MAX_RESTARTS = 100
MAX_SPARES = DEFAULTS.MAX_SPARES  # @torchrun(spares=K)'s bound, the bench's on the wire
# A bigger script is generated, not compiled before the start (that would cost every node the time).
MAX_SOURCE_CHECK = 16 * 1024 * 1024


def _seconds(value: Any, source: str, minimum: float, why: str = "shorter reads a busy node as a dead one") -> float:
    if isinstance(value, bool):
        raise TorchrunInvalidArgument("%s=%s is not a number of seconds." % (source, shown(value)))
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        raise TorchrunInvalidArgument("%s=%s is not a number of seconds." % (source, shown(value))) from None
    if not math.isfinite(seconds):
        raise TorchrunInvalidArgument("%s=%s must be a finite number of seconds." % (source, shown(value)))
    if seconds < minimum:
        raise TorchrunInvalidArgument("%s=%s: must be at least %g seconds (%s)." % (source, shown(value), minimum, why))
    return seconds


def validate_timeouts(heartbeat: Any, start: Any) -> Tuple[float, float]:
    """``@torchrun(heartbeat_timeout, start_timeout)``, checked at flow start."""
    return (
        _seconds(heartbeat, "@torchrun(heartbeat_timeout)", MIN_HEARTBEAT_TIMEOUT),
        _seconds(start, "@torchrun(start_timeout)", MIN_START_TIMEOUT),
    )


def validate_hang_timeout(value: Any) -> Optional[float]:
    """``@torchrun(hang_timeout)``: None (off) or seconds."""
    if value is None:
        return None
    return _seconds(value, "@torchrun(hang_timeout)", MIN_HANG_TIMEOUT,
                    "the gang hears each node's silence once a second; None turns it off")


def validate_restarts(value: Any, max_restarts: bool) -> int:
    """``@torchrun(restarts=N)``; ``max_restarts``: whether the step's ``torchrun_args`` also asks torch's
    own restart (one of the two, never both)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RESTARTS:
        raise TorchrunInvalidArgument(
            "@torchrun(restarts=%s): a whole number of restarts from 0 to %d." % (shown(value), MAX_RESTARTS))
    if value and max_restarts:
        raise TorchrunInvalidArgument(restarts_clash("@torchrun(torchrun_args)", value))
    return value


def validate_spares(value: Any, restarts: Optional[int], num_parallel: Sequence[Any] = ()) -> int:
    """``@torchrun(spares=K)``. ``restarts``: the step's, as checked (None where refused: said there).
    ``num_parallel``: the graph's for the step's entries, as text (a literal is checked here, anything
    else at the task's start, ``check_spares_fit``). No platform is refused: every one that runs
    ``@parallel`` keeps a spare's task alive and lets the node taken out end fine (Metaflow 2.19's
    plugins/parallel_decorator.py, kubernetes/kubernetes_jobsets.py, aws/batch/batch_client.py)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SPARES:
        raise TorchrunInvalidArgument(
            "@torchrun(spares=%s): a whole number of spare nodes from 0 to %d." % (shown(value), MAX_SPARES))
    if value and restarts == 0:
        raise TorchrunInvalidArgument(
            "@torchrun(spares=%d) without restarts: a spare comes in only in an in-step restart, and restarts=0 "
            "(the default) allows none. Set restarts=N (N >= 1; each swap counts as one of the N), or drop "
            "spares." % value)
    for nodes in literal_counts(num_parallel):
        check_spares_fit(value, nodes)
    return value


def validate_snapshots(value: Any, restarts: Optional[int]) -> Optional[int]:
    """``@torchrun(snapshots)``: None where they are off, else the trainers' interval (0: chosen from a
    save's cost). On by default where a restart is allowed; asked for without one, refused: a snapshot
    serves only an in-step restart (a @retry's new task starts with an empty store)."""
    if isinstance(value, str):
        text = value.strip().lower()
        value = {"true": True, "1": True, "false": False, "0": False, "none": None, "": None}.get(
            text, int(text) if text.isdigit() else value)
    if value is None:
        return 0 if restarts else None
    if value is False or (type(value) is int and value == 0):
        return None
    every = 0 if value is True else value
    if isinstance(every, bool) or not isinstance(every, int) or not 1 <= (every or 1) <= DEFAULTS.MAX_SNAPSHOT_EVERY:
        raise TorchrunInvalidArgument(
            "@torchrun(snapshots=%s): True, False, or a whole number of steps from 1 to %d between the trainers' "
            "snapshots." % (shown(value), DEFAULTS.MAX_SNAPSHOT_EVERY))
    if restarts == 0:
        raise TorchrunInvalidArgument(
            "@torchrun(snapshots=%s) without restarts: a snapshot in memory serves an in-step restart, and "
            "restarts=0 (the default) allows none. Set restarts=N (N >= 1), or drop snapshots." % shown(value))
    return every


def validate_snapshot_memory(value: Any) -> Optional[float]:
    """``@torchrun(snapshot_memory)``: the node's snapshot store's budget, MB as a whole number or a share
    of the room the node's container has (``snapshots/node/budget.py``) as ``"N%"``; returned as MB (> 1) or
    a share (<= 1); None: the default."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().endswith("%"):
        number = value.strip()[:-1].strip()
        share = float(number) if number.replace(".", "", 1).isdigit() else -1.0
        if 1 <= share <= 90:
            return share / 100
    elif isinstance(value, int) and not isinstance(value, bool) and 16 <= value <= 1 << 24:
        return float(value)
    raise TorchrunInvalidArgument(
        "@torchrun(snapshot_memory=%s): the node's memory for snapshots, in MB (a whole number from 16 to %d) "
        "or as a share of the memory the node's container has room for (\"1%%\" to \"90%%\")."
        % (shown(value), 1 << 24))


def validate_min_nodes(value: Any, restarts: Optional[int], spares: Any, num_parallel: Sequence[Any] = (),
                       decorators: Sequence[Tuple[str, Any]] = ()) -> Optional[int]:
    """``@torchrun(min_nodes=M)``: a lost node with no spare left takes the gang down to fewer nodes, never
    under M. It goes on in an in-step restart, so it needs restarts; a literal ``num_parallel`` is checked
    here, anything else at the task's start (``check_min_nodes_fit``)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < MAX_NODE:
        raise TorchrunInvalidArgument(
            "@torchrun(min_nodes=%s): the fewest nodes that may go on training after a node is lost, a whole "
            "number from 1 to %d." % (shown(value), MAX_NODE - 1))
    if restarts == 0:
        raise TorchrunInvalidArgument(
            "@torchrun(min_nodes=%d) without restarts: the gang goes on with fewer nodes in an in-step restart, "
            "and restarts=0 (the default) allows none. Set restarts=N (N >= 1; each loss counts as one of the "
            "N), or drop min_nodes." % value)
    for name, _ in decorators:
        if name in SHRINK_REFUSED:
            raise TorchrunInvalidArgument(
                "@torchrun(min_nodes=%d) with @%s: %s Drop min_nodes (spares still replace a node whose ranks "
                "fail)." % (value, name, SHRINK_REFUSED[name]))
    extra = spares if isinstance(spares, int) and not isinstance(spares, bool) and spares > 0 else 0
    for nodes in literal_counts(num_parallel):
        check_min_nodes_fit(value, extra, nodes)
    return value


def validate_swap_stragglers(value: Any, spares: Any, restarts: Optional[int]) -> Optional[float]:
    """``@torchrun(swap_stragglers=S)``: a rank the others have waited for at the collectives for S seconds
    (the arrival signal, docs/seeing-the-gang.md) has its node swapped for a spare, in an in-step restart."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and 10 <= value <= DEFAULTS.MAX_SWAP_STRAGGLERS):
        raise TorchrunInvalidArgument(
            "@torchrun(swap_stragglers=%s): the seconds a rank stays the one the others wait for before its node "
            "is swapped for a spare, from 10 to %d." % (shown(value), DEFAULTS.MAX_SWAP_STRAGGLERS))
    if not (isinstance(spares, int) and not isinstance(spares, bool) and spares > 0) or restarts == 0:
        raise TorchrunInvalidArgument(
            "@torchrun(swap_stragglers=%s) needs a spare to swap in and a restart to do it: set spares=K (K >= 1) "
            "and restarts=N (N >= 1; each swap counts as one of the N), or drop swap_stragglers." % shown(value))
    return float(value)


# Platforms where a node's loss ends the whole job whatever the gang decides: why, for the refusal.
SHRINK_REFUSED = {
    "batch": "AWS Batch ends a multi-node job when one of its nodes' containers is lost, so no node can be "
             "lost while the others go on.",
}


def check_min_nodes_fit(min_nodes: Optional[int], spares: int, num_parallel: int) -> None:
    """M at most the nodes that train (``num_parallel - spares``)."""
    active = num_parallel - spares
    if min_nodes is not None and min_nodes > active:
        raise TorchrunInvalidArgument(
            "@torchrun(min_nodes=%d) with num_parallel=%d%s: the gang trains on %d node%s, fewer than min_nodes. "
            "Give min_nodes=%d or less (the fewest nodes that may go on after a loss), or more nodes."
            % (min_nodes, num_parallel, " and spares=%d" % spares if spares else "", active,
               "" if active == 1 else "s", active))


def check_spares_fit(spares: int, num_parallel: int) -> None:
    """At least one node trains (``num_parallel - spares``): at ``step_init`` for a literal, at the task's
    start for the real count."""
    if spares and spares >= num_parallel:
        raise TorchrunInvalidArgument(
            "@torchrun(spares=%d) with num_parallel=%d: the gang trains on num_parallel - spares nodes, which "
            "leaves none. Enter the step with num_parallel=N+%d for N nodes that train, or give fewer spares."
            % (spares, num_parallel, spares))


def literal_counts(num_parallel: Sequence[Any]) -> List[int]:
    """The ``num_parallel`` entries written as whole numbers (a variable is unknown until the step runs;
    0, no ``num_parallel``, is the graph check's)."""
    written = [str(text).strip() for text in num_parallel]
    return [int(w) for w in written if w.isdecimal() and w.isascii() and int(w) >= 1]


RETRY_ON = ("any", "infrastructure")
# "any" keeps Metaflow's @retry as it is: see docs/resume.md for why.
DEFAULT_RETRY_ON = "any"


def validate_retry_on(value: Any) -> str:
    """@torchrun(retry_on=...): which failures the next attempt runs for (record/attempts.py reads it)."""
    if value is None:
        return DEFAULT_RETRY_ON
    if not isinstance(value, str) or value not in RETRY_ON:
        raise TorchrunInvalidArgument(
            "@torchrun(retry_on=%r): takes %s." % (value, " or ".join(repr(v) for v in RETRY_ON)))
    return value


def retry_on_clash(where: str, max_restarts: Any) -> str:
    """torch's own ``max_restarts`` reruns a bug too, which ``retry_on="infrastructure"`` asks never to."""
    return ("@torchrun(retry_on='infrastructure') with %s max_restarts=%s: torch's own restart reruns "
            "the ranks after any failure, a Python exception in your code too, which retry_on='infrastructure' "
            "asks never to retry. Use @torchrun(restarts=%s) instead of max_restarts: the gang's restart, which "
            "restarts the ranks after an infrastructure failure only (docs/resume.md)."
            % (where, max_restarts, max_restarts))


def restarts_clash(where: str, restarts: int) -> str:
    """The gang's ``restarts`` and torch's ``max_restarts``: one of them, never both."""
    return ("@torchrun(restarts=%d) and %s max_restarts both restart the ranks: give one. restarts is the "
            "gang's (every node's ranks restarted together, rank 0 on node 0, not after a Python exception "
            "in your code); max_restarts is torch's own (docs/resume.md)." % (restarts, where))


def step_timeout(specs: Iterable[Tuple[str, Mapping[str, Any]]]) -> Optional[float]:
    """The step's ``@timeout`` in seconds; None without one (or with one Metaflow itself would refuse)."""
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
    """``@torchrun(shutdown_grace)``, capped by the step's ``@timeout`` (the platform stops the task then)."""
    grace = _seconds(value, "@torchrun(shutdown_grace)", 0.0, "0 stops the ranks at once")
    if step_timeout is not None and step_timeout > 0:
        grace = min(grace, float(step_timeout))
    return grace


def check_path_text(path: str, what: str) -> None:
    """A path the system can be asked about: no NUL (``os.stat`` raises ``ValueError``) and encodable
    (a lone surrogate raises ``UnicodeEncodeError``)."""
    if not isinstance(path, str):
        return
    if "\0" in path:
        raise TorchrunInvalidArgument("%s %s contains a NUL character, which no file path can hold."
                                      % (what, shown(path[:200])))
    try:
        os.fsencode(path)
    except UnicodeEncodeError as e:
        raise TorchrunInvalidArgument("%s %s cannot be a file path on this system: %s."
                                      % (what, shown(path[:200]), e.reason)) from None


def refuse_directory(candidate: str, shown: str) -> None:
    if not os.path.isdir(candidate):
        return
    hint = ""
    if os.path.isfile(os.path.join(candidate, "__main__.py")):
        hint = "; to run its __main__.py, pass %r" % os.path.join(shown, "__main__.py")
    raise TorchrunInvalidArgument("entrypoint %r is a directory (%s), not a Python script%s."
                                  % (shown, os.path.abspath(candidate), hint))


_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def refuse_special(candidate: str, shown: str) -> None:
    """Something there Python cannot run, said as what it is; ``stat`` does not open it (a FIFO cannot block)."""
    try:
        mode = os.stat(candidate).st_mode
    except (OSError, ValueError):  # ValueError: a path no system call takes (check_path_text)
        return
    kind = next((name for test, name in _KINDS if test(mode)), None)
    if kind is None:
        return
    real = os.path.realpath(candidate)
    where = os.path.abspath(candidate) + (" -> %s" % real if real != os.path.abspath(candidate) else "")
    raise TorchrunInvalidArgument("entrypoint %r (%s) is %s, not a Python script: @torchrun runs Python scripts "
                                  "(or functions)." % (shown, where, kind))


def check_python_source(path: str, shown: str) -> None:
    """``path`` is something ``python path`` runs: source that compiles (a SyntaxError named with its file
    and line), a compiled ``.pyc`` or a zip application."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
            if head.startswith(importlib.util.MAGIC_NUMBER) or head.startswith(b"PK\x03\x04"):
                return
            if b"\0" in head:
                raise TorchrunInvalidArgument("entrypoint %r (%s) is not a Python script: it is a binary file. "
                                              "@torchrun runs Python scripts (or functions)." % (shown, path))
            if os.fstat(f.fileno()).st_size > MAX_SOURCE_CHECK:
                return
            source = head + f.read()
    except OSError as e:
        raise TorchrunInvalidArgument("entrypoint %r (%s) cannot be read: %s."
                                      % (shown, path, e.strerror or e)) from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the ranks show the script's warnings
            compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as e:
        line = (e.text or "").strip()
        raise TorchrunInvalidArgument(
            "entrypoint %r is not valid Python: %s (%s, line %s)%s. @torchrun runs Python scripts (or functions)."
            % (shown, e.msg, e.filename or path, e.lineno, (": %s" % line[:200]) if line else "")) from None
    except ValueError as e:  # null bytes past the first block
        raise TorchrunInvalidArgument("entrypoint %r (%s) is not a Python script: %s." % (shown, path, e)) from None
    except (RecursionError, MemoryError):
        return  # too deep to check here; the ranks will say


def resolve_entrypoint(entrypoint: Any, search_dirs: Sequence[str]) -> str:
    """An existing script's absolute path, looked up in the task's working directory, then the flow
    file's (``python examples/ddp/flow.py run`` finds ``train.py`` beside the flow)."""
    try:
        path = os.fspath(entrypoint) if isinstance(entrypoint, (str, os.PathLike)) else None
    except Exception as e:  # a user's __fspath__
        raise TorchrunInvalidArgument("entrypoint %s: os.fspath() failed: %s: %s."
                                      % (shown(entrypoint), type(e).__name__, e)) from None
    if not path or not isinstance(path, str):  # bytes from __fspath__ too: paths here are text
        raise TorchrunInvalidArgument("entrypoint must be the path of a Python script, not %s." % (shown(entrypoint),))
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
    raise TorchrunInvalidArgument("entrypoint %s does not exist in %s%s." % (
        shown(path), " or ".join(dirs), did_you_mean(os.path.basename(path), python_files(dirs))))


LISTED_PER_DIR = 2000  # a directory listed this far for a "did you mean": a huge one costs no more


def python_files(dirs: Sequence[str]) -> List[str]:
    """Names of the Python files in ``dirs``, at most ``LISTED_PER_DIR`` each."""
    names: List[str] = []
    for d in dirs:
        try:
            with os.scandir(d) as entries:
                names.extend(e.name for e in itertools.islice(entries, LISTED_PER_DIR) if e.name.endswith(".py"))
        except OSError:
            continue
    return names


def check_picklable(args: Any) -> bytes:
    """A function entrypoint's arguments as the ranks get them: pickled once, here."""
    try:
        return pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise TorchrunInvalidArgument(
            "entrypoint_args cannot be pickled for the ranks: %s: %s. Pass small picklable values (numbers, strings, "
            "paths, plain containers); big data belongs in files or Metaflow artifacts."
            % (type(e).__name__, e)) from None


def validate_args_as(value: Any, source: str) -> str:
    """``args_as``: how a dict of entrypoint_args is spelled (``"0.2"``: 0.2's JSON spelling, opt-in)."""
    text = "ours" if value is None else str(value).strip()
    if text not in ("ours", "0.2"):
        raise TorchrunInvalidArgument("%s=%s: give \"0.2\" (metaflow-torchrun 0.2's spelling: --k true, --k [1, 2]) or "
                                      "leave it out (True is a bare --k, a list is --k a b)." % (source, shown(value)))
    return text


