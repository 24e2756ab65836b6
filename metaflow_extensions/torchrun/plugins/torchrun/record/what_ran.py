"""What a call ran, for the card and the record (``Ran``): the entrypoint, its
arguments with secret-looking ones masked, node 0's torchrun command, each
node's log folder, and the versions of torch, Metaflow, Python and this package.
"""

from __future__ import annotations

import itertools
import platform
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .. import load_order  # noqa: F401  (Metaflow first, whatever the user imports first)
import metaflow

from ..base.codec import Int, Items, Lenient, OneOf, Text, Via
from ..launch import CallPlan
from ..launch.torch_checks import find_torch
from ..base.text import shorten
from ..base.version import __version__

MASK = "****"
# An argument whose name says it holds a secret: its value is never shown.
SECRET_NAME = re.compile(r"token|key|password|passwd|secret", re.I)
MAX_ARG_CHARS = 200
MAX_ARGS = 64
# An argument as stored: a masked one's name is not cut (``--<name>=****``).
MAX_STORED_ARG = 4 * MAX_ARG_CHARS
Arg = Annotated[str, Text(MAX_STORED_ARG)]
# A script's arguments, or a function's (by name, in order, or one value).
Args = Union[List[str], Dict[str, str], str]


def mask_argv(argv: Sequence[str]) -> List[str]:
    """``--api-token x`` and ``--api-token=x`` -> the value masked; the rest cut to ``MAX_ARG_CHARS``."""
    out: List[str] = []
    hide_next = False
    for arg in map(str, list(argv)[:MAX_ARGS]):
        name, eq, _ = arg.partition("=")
        if hide_next and not arg.startswith("--"):
            out.append(MASK)
            hide_next = False
        elif arg.startswith("-") and SECRET_NAME.search(name):
            out.append(name + "=" + MASK if eq else arg)
            hide_next = not eq
        else:
            out.append(shorten(arg, MAX_ARG_CHARS))
            hide_next = False
    if len(argv) > MAX_ARGS:
        out.append("… %d more" % (len(argv) - MAX_ARGS))
    return out


def mask_value(value: Any) -> "Args":
    """A function's arguments as ``repr`` (cut), values under secret-looking keys masked."""
    if isinstance(value, Mapping):
        return {str(k): MASK if SECRET_NAME.search(str(k)) else _short(v) for k, v in list(value.items())[:MAX_ARGS]}
    if isinstance(value, (list, tuple)):
        return [_short(v) for v in list(value)[:MAX_ARGS]]
    return _short(value)


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = "<%s>" % type(value).__name__
    return shorten(text, MAX_ARG_CHARS)


def versions() -> Dict[str, str]:
    """Read without importing torch (seconds on a GPU node)."""
    return {"torch": find_torch().version or "not found", "metaflow": str(getattr(metaflow, "__version__", "?")),
            "python": platform.python_version(), "metaflow-torchrun": __version__}


def _args(value: Any) -> Args:
    """Read and written alike: each argument a text, cut."""
    if isinstance(value, str):
        return value[:MAX_STORED_ARG]
    if isinstance(value, list):
        return [str(v)[:MAX_STORED_ARG] for v in value[:MAX_ARGS + 1]]
    if isinstance(value, Mapping):
        return {str(k)[:MAX_STORED_ARG]: str(v)[:MAX_STORED_ARG] for k, v in itertools.islice(value.items(), MAX_ARGS)}
    raise ValueError("not a list, an object or a text")


@dataclass(frozen=True)
class Ran(Lenient):
    """What one node ran, as the card shows it (node 0's is the gang's)."""

    entrypoint: Annotated[str, Text(4096)]
    kind: Annotated[str, OneOf(("script", "function"))] = "script"
    args: Annotated[Args, Via(_args, _args)] = field(default_factory=list)
    command: Annotated[Tuple[Arg, ...], Items(MAX_ARGS + 1)] = ()
    log_dir: Annotated[str, Text(4096)] = ""
    node: Annotated[int, Int(0, (1 << 31) - 1)] = 0
    versions: Annotated[Dict[Annotated[str, Text(64)], Annotated[str, Text(200)]], Items(16)] = \
        field(default_factory=dict)


def record(plan: CallPlan, command: Sequence[str], log_dir: Optional[str], node_index: int) -> Ran:
    function = plan.function is not None
    args: Args = mask_value(plan.function_args) if function else mask_argv(plan.entry_argv)
    return Ran(plan.script or plan.entry_name, "function" if function else "script", args,
               tuple(mask_argv(command)), log_dir or "", node_index, versions())


def log_dirs(ran: Ran, num_nodes: int, limit: int = 8) -> List[List[str]]:
    """Each node's log folder: the same path on each host, named by run, step, task, call and node."""
    own, mine = ran.log_dir, "node-%d" % ran.node
    if not own.endswith(mine):
        return [["node %d" % ran.node, own]] if own else []
    rows = [["node %d" % i, own[: -len(mine)] + "node-%d" % i] for i in range(min(num_nodes, limit))]
    if num_nodes > limit:
        rows.append(["…", "%d more nodes, the same path with their index" % (num_nodes - limit)])
    return rows


def rows(ran: Optional[Ran], num_nodes: int) -> List[List[str]]:
    """The card's "what ran" table (each value one line)."""
    if ran is None:
        return []
    args = ran.args
    shown_args = " ".join(args) if isinstance(args, list) and ran.kind == "script" else str(args)
    out = [["entrypoint (%s)" % ran.kind, ran.entrypoint],
           ["arguments", shown_args or "(none)"],
           ["node 0's torchrun command", " ".join(ran.command)]]
    out += [["log folder, %s" % node, path] for node, path in log_dirs(ran, num_nodes)]
    out += [["version of %s" % name, v] for name, v in sorted(ran.versions.items())]
    return out
