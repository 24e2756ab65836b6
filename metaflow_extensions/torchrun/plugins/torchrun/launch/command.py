"""Pure translation of a topology and user arguments into torchrun's argv.

Nothing here touches processes, files or the environment, so every rule about how
arguments are spelled can be unit-tested exhaustively. Arguments are always
produced as an argv list: nothing is ever joined into a shell string, so spaces,
quotes, ``$(...)`` and backticks reach the script exactly as given.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from .. import compat
from ..errors import TorchrunInvalidArgument
from ..gang.config import RDZV_STORE_NODE

ArgSpec = Union[None, Sequence[Any], Mapping[str, Any]]

# The Python module every rank runs first; it then runs the user's entrypoint.
BOOTSTRAP_MODULE = "metaflow_extensions.torchrun.plugins.torchrun.rank.bootstrap"

# torch's c10d rendezvous waits this long by default (join_timeout).
TORCH_JOIN_TIMEOUT = 600

_SCALARS = (str, int, float, os.PathLike)


def _scalar(value: Any, what: str) -> str:
    # bool is an int subclass: in a list it is spelled as Python spells it.
    if isinstance(value, _SCALARS):
        try:
            return os.fsdecode(value) if isinstance(value, os.PathLike) else str(value)
        except Exception as e:
            raise TorchrunInvalidArgument(
                "%s: cannot turn a %s into a command-line argument (str() failed: %s: %s)."
                % (what, type(value).__name__, type(e).__name__, e)
            ) from None
    raise TorchrunInvalidArgument(
        "%s: cannot pass %r (a %s) as a command-line argument; use a string or a number."
        % (what, value, type(value).__name__)
    )


def _flag(key: Any, what: str) -> str:
    if not isinstance(key, str) or not key.strip("-"):
        raise TorchrunInvalidArgument(
            "%s: option name %r must be a non-empty string." % (what, key)
        )
    return "--" + key.lstrip("-")


def encode_args(args: ArgSpec, what: str = "entrypoint_args") -> List[str]:
    """Turn a list (argv as given) or a dict (``--key value`` pairs) into argv.

    In a dict, ``True`` is a bare flag, ``False`` drops the option and a list
    value becomes ``--key a b``. ``None`` is refused: metaflow-torchrun 0.2 made it
    a bare flag, dropping it would silently change what such code passes.
    """
    if args is None:
        return []
    if isinstance(args, Mapping):
        argv: List[str] = []
        for key, value in args.items():
            flag = _flag(key, what)
            if value is None:
                raise TorchrunInvalidArgument(compat.none_value_error(what, key))
            if value is True:
                argv.append(flag)
            elif value is False:
                continue
            elif isinstance(value, (list, tuple)):
                argv.append(flag)
                argv.extend(_scalar(v, "%s[%r]" % (what, key)) for v in value)
            else:
                argv.extend([flag, _scalar(value, "%s[%r]" % (what, key))])
        return argv
    if isinstance(args, (list, tuple)):
        return [_scalar(v, what) for v in args]
    raise TorchrunInvalidArgument(
        "%s must be a list (argv as given) or a dict ({'key': value} -> --key value), "
        "not %s %r." % (what, type(args).__name__, args)
    )


def canonical_option(name: str) -> str:
    """torchrun spells options both ``max_restarts`` and ``max-restarts``."""
    return name.strip().lstrip("-").replace("_", "-")


def parse_options(args: ArgSpec, what: str = "torchrun_args", check_owned: bool = True) -> Dict[str, Any]:
    """Read user torchrun options into ``{canonical name: value}``.

    Values are what the option should be set to: ``True`` for a bare flag, a
    string, or a list for an option repeated with several values. ``False`` in a
    dict removes an option the decorator would otherwise set; ``None`` and ``''``
    are refused (metaflow-torchrun 0.2 made both a bare flag). A list is argv
    (``["--max-restarts", "2"]``) or, as in 0.2, name/value pairs
    (``["max_restarts", 2]``). Options @torchrun sets itself (``compat.OWNED_OPTIONS``)
    are refused with the @torchrun way, unless ``check_owned`` is False.
    """
    if args is None:
        return {}
    if isinstance(args, Mapping):
        out: Dict[str, Any] = {}
        for key, value in args.items():
            _flag(key, what)
            out[canonical_option(key)] = _option_value(value, what, key)
    elif isinstance(args, (list, tuple)):
        if args and isinstance(args[0], str) and compat.is_pair_list([args[0]]):
            out = _parse_pairs(list(args), what)
        else:
            out = _parse_argv([_scalar(v, what) for v in args], args, what)
    else:
        raise TorchrunInvalidArgument(
            "%s must be a list or a dict, not %s %r." % (what, type(args).__name__, args)
        )
    if check_owned:
        compat.refuse_owned(out, what)
    return out


def _option_value(value: Any, what: str, key: Any) -> Any:
    if value is None:
        raise TorchrunInvalidArgument(compat.none_value_error(what, key))
    if value is True or value is False:
        return value
    if isinstance(value, (list, tuple)):
        return [_scalar(v, "%s[%r]" % (what, key)) for v in value]
    text = _scalar(value, "%s[%r]" % (what, key))
    if text == "":
        raise TorchrunInvalidArgument(compat.empty_option_error(what, key))
    return text


def _parse_pairs(items: List[Any], what: str) -> Dict[str, Any]:
    """metaflow-torchrun 0.2's list form: ``["nproc_per_node", 2, "max_restarts", 1]``."""
    if len(items) % 2:
        raise TorchrunInvalidArgument(
            "%s=%r: a list that starts with a name without dashes is read as name, value "
            "pairs (metaflow-torchrun 0.2), and this one has an odd length. Write "
            "[\"--name\", \"value\", ...] (torchrun's argv) or a dict." % (what, items)
        )
    out: Dict[str, Any] = {}
    for key, value in zip(items[0::2], items[1::2]):
        _flag(key, what)
        out[canonical_option(key)] = _option_value(value, what, key)
    return out


def _parse_argv(tokens: List[str], args: Any, what: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    key: Optional[str] = None
    for token in tokens:
        if token.startswith("-") and len(token) > 1 and not _is_number(token):
            _flag(token.split("=", 1)[0], what)
            if "=" in token:
                name, _, value = token.partition("=")
                out[canonical_option(name)] = value
                key = None
            else:
                key = canonical_option(token)
                out[key] = True
        elif key is None:
            raise TorchrunInvalidArgument(
                "%s: %r is not preceded by an option name (in %r)."
                % (what, token, list(args))
            )
        else:
            current = out[key]
            if current is True:
                out[key] = token
            elif isinstance(current, list):
                current.append(token)
            else:
                out[key] = [current, token]
    return out


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def options_to_argv(options: Mapping[str, Any]) -> List[str]:
    argv: List[str] = []
    for name, value in options.items():
        if value is None or value is False:
            continue
        if value is True:
            argv.append("--" + name)
        elif isinstance(value, list):
            argv.append("--" + name)
            argv.extend(value)
        else:
            argv.extend(["--" + name, str(value)])
    return argv


@dataclass(frozen=True)
class Launch:
    """Everything that decides this node's torchrun command line."""

    python: str
    num_nodes: int
    node_index: int
    nproc_per_node: Union[int, str]
    rdzv_host: str
    rdzv_port: int
    rdzv_id: str
    entrypoint: str  # a script path; or bootstrap arguments for a function
    entrypoint_argv: Sequence[str] = ()
    user_options: Mapping[str, Any] = ()  # type: ignore[assignment]
    max_restarts: int = 0
    local_addr: Optional[str] = None
    # The gang's start_timeout: a node launches as soon as it reaches a call,
    # so its rendezvous may wait that long for the last node to arrive.
    start_timeout: float = 600.0


def format_endpoint(host: str, port: int) -> str:
    # An IPv6 literal needs brackets or torch splits it at the wrong colon.
    if ":" in host and not host.startswith("["):
        host = "[%s]" % host
    return "%s:%d" % (host, port)


def default_options(launch: Launch) -> Dict[str, Any]:
    """What the decorator sets; ``torchrun_args`` may override any of it."""
    return {
        "nnodes": str(launch.num_nodes),
        "nproc-per-node": str(launch.nproc_per_node),
        "rdzv-backend": "c10d",
        "rdzv-endpoint": format_endpoint(launch.rdzv_host, launch.rdzv_port),
        "rdzv-id": launch.rdzv_id,
        # The control node hosts the rendezvous store; saying so explicitly avoids
        # torch guessing from host names, which fails behind NAT and in namespaces.
        "rdzv-conf": "is_host=%d,join_timeout=%d" % (1 if launch.node_index == RDZV_STORE_NODE else 0,
                                                     join_timeout(launch.start_timeout)),
        "max-restarts": str(launch.max_restarts),
        # The address other nodes reach this one at (see network.py).
        "local-addr": launch.local_addr,
    }


def join_timeout(start_timeout: float) -> int:
    """torch's rendezvous wait, in whole seconds: ``start_timeout`` for the
    last node to reach the call (the gang names it if it never does), then
    torch's own default of 600 s for that node's torchrun to start."""
    return int(math.ceil(start_timeout)) + TORCH_JOIN_TIMEOUT


def _merge_rdzv_conf(ours: str, theirs: str) -> str:
    """The user's rendezvous settings win key by key, and reach torch as
    written (torch names a malformed one); ``is_host`` is kept unless they set
    it, or torch would guess which node hosts the store."""
    items = {item.split("=", 1)[0]: item for item in ours.split(",")}
    for item in theirs.split(","):
        items[item.partition("=")[0].strip()] = item
    return ",".join(items.values())


def build_command(launch: Launch) -> List[str]:
    """The full argv of ``python -m torch.distributed.run`` for one node."""
    options = default_options(launch)
    user = dict(launch.user_options or {})
    conf = user.get("rdzv-conf")
    if isinstance(conf, str):
        user["rdzv-conf"] = _merge_rdzv_conf(options["rdzv-conf"], conf)
    options.update(user)
    return (
        [launch.python, "-m", "torch.distributed.run"]
        + options_to_argv(options)
        + ["--module", BOOTSTRAP_MODULE, launch.entrypoint]
        + list(launch.entrypoint_argv)
    )


def rdzv_id_for(flow: str, run_id: str, step: str, control_task_id: str, attempt: int) -> str:
    """One id per gang: a retry or another foreach branch never joins this one."""
    raw = "%s-%s-%s-%s-%d" % (flow, run_id, step, control_task_id, attempt)
    return "".join(c if (c.isascii() and c.isalnum()) or c in "-_." else "_" for c in raw)
