"""Pure: a topology and the user's arguments as torchrun's argv, a list never joined into a shell
string, so spaces, quotes, ``$(...)`` and backticks reach the script exactly as given."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ..base import defaults as DEFAULTS
from ..errors import Problems, TorchrunInvalidArgument, shown
from .options import flag_name as _flag
from .options import scalar as _scalar
from ..gang.config import RDZV_STORE_NODE

ArgSpec = Union[None, Sequence[Any], Mapping[str, Any]]

# The Python module every rank runs first; it then runs the user's entrypoint.
BOOTSTRAP_MODULE = "metaflow_extensions.torchrun.plugins.torchrun.procs.bootstrap"
# torchrun itself, keeping its store on loopback when the endpoint is (procs/agent.py).
AGENT_MODULE = "metaflow_extensions.torchrun.plugins.torchrun.procs.agent"
# The node's warm process, which forks the agent and the ranks (procs/zygote.py).
ZYGOTE_MODULE = "metaflow_extensions.torchrun.plugins.torchrun.procs.zygote"

MAX_ARG_STRLEN = 32 * 4096  # Linux: one argument or environment string may be at most 32 pages
COMMAND_MARGIN = 64 * 1024  # what @torchrun adds to the command and the environment, with room to spare
TORCH_JOIN_TIMEOUT = 600  # torch's c10d rendezvous's default join_timeout
ARGS_STYLES = ("ours", "0.2")  # a dict of entrypoint_args as argv: ours, or 0.2's (@torchrun(args_as="0.2"))


def encode_args(args: ArgSpec, what: str = "entrypoint_args", style: str = "ours") -> List[str]:
    """A list (argv as given) or a dict as argv: in a dict ``True`` (and 0.2's deprecated ``None``) is a
    bare flag, ``False`` drops the option, a list is ``--key a b``; ``style="0.2"`` spells values as 0.2
    did (``legacy_value``). Every bad key is named in one message."""
    if args is None:
        return []
    if isinstance(args, Mapping):
        argv: List[str] = []
        problems = Problems()
        for key, value in args.items():
            part = problems.check(_encode_item, key, value, what, style)
            argv.extend(part or [])
        problems.raise_all()
        return argv
    if isinstance(args, (list, tuple)):
        problems = Problems()
        out = [problems.check(_scalar, v, what) for v in args]
        problems.raise_all()
        return [v for v in out if v is not None]
    raise TorchrunInvalidArgument("%s must be a list (argv as given) or a dict ({'key': value} -> --key value), "
                                  "not %s %s." % (what, type(args).__name__, shown(args)))


def _encode_item(key: Any, value: Any, what: str, style: str) -> List[str]:
    flag = _flag(key, what)
    if style == "0.2":
        if value is None or value == "":
            return [flag]
        return [flag, legacy_value(value, "%s[%s]" % (what, shown(key)))]
    if value is None or value is True:
        return [flag]
    if value is False:
        return []
    if isinstance(value, (list, tuple)):
        problems = Problems()
        items = [problems.check(_scalar, v, "%s[%s]" % (what, shown(key))) for v in value]
        problems.raise_all()
        return [flag] + [v for v in items if v is not None]
    return [flag, _scalar(value, "%s[%s]" % (what, shown(key)))]


def legacy_value(value: Any, what: str) -> str:
    """0.2's spelling of a dict value: its JSON less every double quote (``True`` -> ``true``)."""
    try:
        return json.dumps(value).replace('"', "")
    except (TypeError, ValueError) as e:
        raise TorchrunInvalidArgument("%s: cannot pass %s (a %s) as 0.2 did (as JSON): %s."
                                      % (what, shown(value), type(value).__name__, e)) from None


def keys_given(args: ArgSpec, value: Any) -> List[str]:
    """The keys of a dict given ``value`` (None: 0.2's deprecated bare flag; True, False)."""
    if not isinstance(args, Mapping):
        return []
    return [str(k).lstrip("-") for k, v in args.items() if v is value]


@dataclass(frozen=True)
class EntryArgs:
    """A script's ``entrypoint_args`` as its argv, with the keys of a dict whose meaning the user may need
    told: ``None`` (0.2's deprecated bare flag), ``False`` (left out, ``--key false`` in 0.2) and ``True``
    (a bare flag, named when the script's argparse wanted a value; ``--key true`` in 0.2)."""

    argv: List[str]
    none_keys: Tuple[str, ...] = ()
    false_keys: Tuple[str, ...] = ()
    true_keys: Tuple[str, ...] = ()


def entry_arguments(args: ArgSpec, style: str = "ours") -> EntryArgs:
    """``encode_args`` for a script, every item one a command line can hold."""
    argv = encode_args(args, "entrypoint_args", style)
    check_arguments(argv)
    return EntryArgs(argv, tuple(keys_given(args, None)), tuple(keys_given(args, False)), tuple(keys_given(args, True)))


def options_to_argv(options: Mapping[str, Any]) -> List[str]:
    argv: List[str] = []
    for name, value in options.items():
        if value is not None and value is not False:
            argv.append("--" + name)
            argv.extend([] if value is True else value if isinstance(value, list) else [str(value)])
    return argv


def check_arguments(argv: Iterable[str], what: str = "entrypoint_args") -> None:
    """What no command line can hold is refused, as ``python script.py`` would."""
    for i, token in enumerate(argv):
        if "\0" in token:
            raise TorchrunInvalidArgument("%s: item %d (%s) contains a NUL character, which no command-line "
                                          "argument can hold." % (what, i, shown(token[:80])))


def _encoded(token: str, what: str) -> bytes:
    try:
        return os.fsencode(token)
    except UnicodeEncodeError as e:
        raise TorchrunInvalidArgument("%s: %s cannot be encoded for the command line: %s"
                                      % (what, shown(token[:80]), e)) from None


def check_command_size(options: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    """torchrun's options (the script's arguments travel in a file) and the environment fit ``exec``."""
    argv = options_to_argv(options)
    check_arguments(argv, "torchrun_args")
    total = COMMAND_MARGIN
    for token in argv:
        size = len(_encoded(token, "torchrun_args")) + 1
        if size > MAX_ARG_STRLEN:
            raise TorchrunInvalidArgument("torchrun_args: one value is %d bytes; the system takes at most %d in one "
                                          "command-line argument." % (size, MAX_ARG_STRLEN))
        total += size + 8  # the pointer to it
    for key, value in environ.items():
        size = len(os.fsencode(key)) + len(os.fsencode(value)) + 2
        if size > MAX_ARG_STRLEN:
            raise TorchrunInvalidArgument("the environment variable %s is %d bytes; the system passes at most %d in "
                                          "one variable to a new process (torchrun)." % (key, size, MAX_ARG_STRLEN))
        total += size + 8
    limit = arg_max()
    if total > limit:
        raise TorchrunInvalidArgument("torchrun_args: torchrun's command line and environment would take about %d "
                                      "bytes, more than this system accepts (%d)." % (total, limit))


def arg_max() -> int:
    try:
        value = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError, AttributeError):
        value = -1
    return value if value and value > 0 else 128 * 1024


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
    user_options: Mapping[str, Any] = ()  # type: ignore[assignment]
    local_addr: Optional[str] = None
    # The gang's: a node launches as it reaches a call, so its rendezvous may wait that long for the last.
    start_timeout: float = DEFAULTS.START_TIMEOUT

    @property
    def rdzv_endpoint(self) -> str:
        return format_endpoint(self.rdzv_host, self.rdzv_port)


def format_endpoint(host: str, port: int) -> str:
    # An IPv6 literal needs brackets or torch splits it at the wrong colon.
    if ":" in host and not host.startswith("["):
        host = "[%s]" % host
    return "%s:%d" % (host, port)


def restarts_allowed(options: Mapping[str, Any]) -> bool:
    """Whether torchrun may start a second round of ranks (``max_restarts`` above 0). Anything but a
    number (``plan_call`` refuses it) counts as no: the static rendezvous, which unpickles nothing, is
    never switched off by a value torch would refuse."""
    value = options.get("max-restarts", 0)
    if isinstance(value, bool):
        return False
    try:
        return int(str(value).strip()) > 0
    except ValueError:
        return False


def default_options(launch: Launch) -> Dict[str, Any]:
    """What the decorator sets; ``torchrun_args`` may override any of it."""
    options: Dict[str, Any] = {
        "nnodes": str(launch.num_nodes),
        "nproc-per-node": str(launch.nproc_per_node),
        "rdzv-backend": "c10d",
        "rdzv-endpoint": launch.rdzv_endpoint,
        "rdzv-id": launch.rdzv_id,
        # Said, not guessed by torch from host names (which fails behind NAT and in namespaces).
        "rdzv-conf": "is_host=%d,join_timeout=%d" % (1 if launch.node_index == RDZV_STORE_NODE else 0,
                                                     join_timeout(launch.start_timeout)),
        "max-restarts": "0",
        # The address other nodes reach this one at (see network.py).
        "local-addr": launch.local_addr,
    }
    if not restarts_allowed(launch.user_options or {}):
        # Static unless torchrun may restart the ranks: node i is node rank i (rank 0 on node 0) and nothing read
        # from the store is unpickled (c10d's dynamic rendezvous keeps its state pickled there: whoever can write
        # to it runs code in every agent); only c10d's lets every agent notice another's new round.
        options["rdzv-backend"] = "static"
        options["node-rank"] = str(launch.node_index)
        # Its one wait: node 0's store for every node, and the other nodes for node 0's store.
        options["rdzv-conf"] = "timeout=%d" % join_timeout(launch.start_timeout)
    return options


def join_timeout(start_timeout: float) -> int:
    """torch's rendezvous wait in whole seconds: ``start_timeout`` for the last node to reach the call (the
    gang names it if it never does), then torch's own 600 s default for that node's torchrun to start."""
    return int(math.ceil(start_timeout)) + TORCH_JOIN_TIMEOUT


def _merge_rdzv_conf(ours: str, theirs: str) -> str:
    """The user's rendezvous settings win key by key, as written (torch names a malformed one); ``is_host``
    is kept unless they set it. A user's ``join_timeout`` sets the static rendezvous's ``timeout`` too."""
    items = {item.split("=", 1)[0]: item for item in ours.split(",")}
    for item in theirs.split(","):
        items[item.partition("=")[0].strip()] = item
    joined = items.get("join_timeout")
    if "timeout" in items and joined is not None and "timeout" not in _keys(theirs):
        items["timeout"] = "timeout=" + joined.partition("=")[2]
    return ",".join(items.values())


def _keys(conf: str) -> List[str]:
    return [item.partition("=")[0].strip() for item in conf.split(",")]


def build_command(launch: Launch) -> List[str]:
    """This node's torchrun argv (``python -m AGENT_MODULE``, which runs ``torch.distributed.run``)."""
    options = default_options(launch)
    user = dict(launch.user_options or {})
    conf = user.get("rdzv-conf")
    if isinstance(conf, str):
        user["rdzv-conf"] = _merge_rdzv_conf(options["rdzv-conf"], conf)
    options.update(user)
    return ([launch.python, "-m", AGENT_MODULE] + options_to_argv(options)
            + ["--module", BOOTSTRAP_MODULE, launch.entrypoint])


def argparse_hint(text: str, keys: Sequence[str]) -> Optional[str]:
    """What 0.2 passed for a ``True`` a rank's argparse wanted a value for, and how to keep that; None when
    ``text`` shows no such refusal."""
    for key in keys:
        flag = "--" + key.lstrip("-")
        pattern = r"argument (?:[^:\s]*/)?%s(?:/[^:\s]*)?: expected (?:one|\d+) argument" % re.escape(flag)
        if re.search(pattern, text or ""):
            return ("%s was given as True, which passes a bare %s (right for a store_true flag); the script wants a "
                    "value. metaflow-torchrun 0.2 passed `%s true`: write '%s': 'true' to keep that, or "
                    "@torchrun(args_as=\"0.2\") for 0.2's spelling of every value." % (key, flag, flag, key))
    return None
