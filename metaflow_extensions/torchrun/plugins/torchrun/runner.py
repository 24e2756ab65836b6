"""``current.torch``: validate a call, build this node's command, supervise it.

The data flows one way: step defaults and call arguments -> topology ->
command -> supervisor -> result, or a typed error naming what went wrong.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
import pickle
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import bootstrap, functions
from .command import (
    ArgSpec,
    Launch,
    build_command,
    encode_args,
    parse_options,
    rdzv_id_for,
)
from .errors import GangAborted, TorchrunFailed, TorchrunInvalidArgument
from .failures import (
    RankFailure,
    describe_exit_code,
    merge_failures,
    parse_torchrun_summary,
    read_failures,
)
from .gang import GangClient, GangConfig, GangServer
from .network import interface_of, local_address_towards
from .resources import NONE as NO_ACCELERATORS
from .resources import Accelerators, check_visible_devices
from .result import TorchrunResult, read_rank_records
from .supervisor import Supervisor
from .topology import Topology, find_free_port, topology_from

# torchrun's own spellings for "as many processes as there are devices/cores".
NPROC_KEYWORDS = ("auto", "gpu", "cpu", "xpu")


@dataclass(frozen=True)
class StepDefaults:
    """What ``@torchrun(...)`` set for the step; call arguments override it."""

    nproc_per_node: Any = None
    torchrun_args: ArgSpec = None
    port: Optional[int] = None
    derived_nproc: Optional[int] = None
    accelerators: Accelerators = NO_ACCELERATORS
    heartbeat_timeout: float = 30.0
    start_timeout: float = 600.0
    label_logs: bool = True


@dataclass(frozen=True)
class GangIdentity:
    flow_name: str
    run_id: str
    step_name: str
    control_task_id: str
    attempt: int

    @property
    def rdzv_id(self) -> str:
        return rdzv_id_for(
            self.flow_name, self.run_id, self.step_name, self.control_task_id, self.attempt
        )


def validate_nproc(value: Any, source: str) -> Union[int, str]:
    """A positive process count, or one of torchrun's device keywords."""
    if isinstance(value, bool):
        raise TorchrunInvalidArgument(
            "%s=%r: nproc_per_node must be a positive integer." % (source, value)
        )
    if isinstance(value, str):
        text = value.strip()
        if text in NPROC_KEYWORDS:
            return text
        try:
            value = int(text)
        except ValueError:
            raise TorchrunInvalidArgument(
                "%s=%r: nproc_per_node must be a positive integer (or one of %s)."
                % (source, value, ", ".join(NPROC_KEYWORDS))
            ) from None
    if not isinstance(value, int):
        raise TorchrunInvalidArgument(
            "%s=%r (a %s): nproc_per_node must be a positive integer."
            % (source, value, type(value).__name__)
        )
    if value < 1:
        raise TorchrunInvalidArgument(
            "%s=%r: nproc_per_node must be at least 1." % (source, value)
        )
    return value


def resolve_nproc(
    call_value: Any,
    user_options: Mapping[str, Any],
    defaults: StepDefaults,
) -> Union[int, str]:
    """Precedence: run() argument > torchrun_args > @torchrun > resources > 1."""
    if call_value is not None:
        return validate_nproc(call_value, "nproc_per_node")
    if user_options.get("nproc-per-node") not in (None, False):
        return validate_nproc(user_options["nproc-per-node"], "torchrun_args nproc_per_node")
    if defaults.nproc_per_node is not None:
        return validate_nproc(defaults.nproc_per_node, "@torchrun(nproc_per_node)")
    if defaults.derived_nproc is not None:
        return validate_nproc(defaults.derived_nproc, "resources")
    return 1


def cuda_devices() -> Tuple[bool, int]:
    """(CUDA usable, visible device count). Importing torch takes seconds, so a
    node with no NVIDIA device files is answered without it."""
    if not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")):
        return False, 0
    try:
        import torch
    except ImportError:
        return False, 0
    if not torch.cuda.is_available():
        return False, 0
    return True, torch.cuda.device_count()


def resolve_entrypoint(entrypoint: Any, search_dirs: Sequence[str]) -> str:
    """An absolute path to an existing script, looked up relative to the task's
    working directory first and then to the flow file's directory, so
    ``python examples/ddp/flow.py run`` finds ``train.py`` beside the flow."""
    if not isinstance(entrypoint, (str, os.PathLike)) or not os.fspath(entrypoint):
        raise TorchrunInvalidArgument(
            "entrypoint must be the path of a Python script, not %r." % (entrypoint,)
        )
    path = os.fspath(entrypoint)
    candidates = [path] if os.path.isabs(path) else [
        os.path.join(d, path) for d in search_dirs
    ]
    for candidate in candidates:
        if os.path.isfile(candidate):
            return os.path.abspath(candidate)
    raise TorchrunInvalidArgument(
        "entrypoint %r does not exist (looked in: %s)."
        % (path, ", ".join(os.path.abspath(os.path.dirname(c) or ".") for c in candidates))
    )


_OPTION_RE = re.compile(r"""["'](--[A-Za-z][\w-]*)["']""")


def known_torchrun_options() -> Optional[set]:
    """Option names torchrun accepts, read from the source of torchrun's parser.

    Reading the file instead of importing ``torch.distributed.run`` keeps torch
    (seconds of CPU, hundreds of MB) out of every Metaflow task process."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "distributed", "run.py")
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except OSError:
        return None
    start = source.find("def get_args_parser")
    end = source.find("\ndef ", start + 1)
    names = {m.group(1)[2:].replace("_", "-") for m in _OPTION_RE.finditer(source[start:end])}
    return names or None


def check_options(options: Mapping[str, Any]) -> None:
    if not options:
        return
    known = known_torchrun_options()
    if known is None:
        return
    unknown = sorted(k for k in options if k not in known)
    if unknown:
        raise TorchrunInvalidArgument(
            "torchrun_args: unknown torchrun option%s %s (see `python -m "
            "torch.distributed.run --help`)."
            % ("s" if len(unknown) > 1 else "", ", ".join("--" + k for k in unknown))
        )


def merged_options(defaults: StepDefaults, call_args: ArgSpec) -> Dict[str, Any]:
    options = parse_options(defaults.torchrun_args, "@torchrun(torchrun_args)")
    options.update(parse_options(call_args, "torchrun_args"))
    return options


class TorchrunHandle:
    """Published as ``current.torch`` on every node of a ``@torchrun`` step."""

    def __init__(
        self,
        identity: GangIdentity,
        defaults: StepDefaults,
        parallel_getter,
        flow_dir: Optional[str] = None,
    ):
        self._identity = identity
        self._defaults = defaults
        self._parallel = parallel_getter
        self._flow_dir = flow_dir
        self.last_result: Optional[TorchrunResult] = None

    def run(
        self,
        entrypoint: Union[str, os.PathLike, Callable[..., Any]],
        entrypoint_args: ArgSpec = None,
        nproc_per_node: Optional[Union[int, str]] = None,
        torchrun_args: ArgSpec = None,
    ) -> TorchrunResult:
        """Run ``entrypoint`` (a script path, or a module-level function) under
        torchrun on this node, with every other node of the step; return when all
        of this node's ranks succeeded, raise ``TorchrunFailed`` otherwise (for a
        function, the rank's original exception, caused by ``TorchrunFailed``)."""
        function = _function_reference(entrypoint, entrypoint_args)
        if function is None:
            search = [os.getcwd()] + ([self._flow_dir] if self._flow_dir else [])
            script = resolve_entrypoint(entrypoint, search)
            entry_argv = encode_args(entrypoint_args, "entrypoint_args")
        options = merged_options(self._defaults, torchrun_args)
        check_options(options)
        nproc = resolve_nproc(nproc_per_node, options, self._defaults)
        options.pop("nproc-per-node", None)  # resolved above, with its precedence
        if isinstance(nproc, int):
            notice = check_visible_devices(nproc, self._defaults.accelerators, *cuda_devices())
            if notice and self._parallel().node_index == 0:
                print(notice, file=sys.stderr, flush=True)

        topology = topology_from(
            self._parallel(), os.environ, self._identity.rdzv_id, self._defaults.port
        )
        rdzv_id = self._identity.rdzv_id
        local_addr = local_address_towards(topology.main_addr) or topology.main_addr
        if not topology.is_local and _is_loopback(local_addr):
            # The control's own name resolved to loopback (a Batch main node whose
            # host name maps to 127.0.1.1): other nodes need its routable address,
            # the source of the default route (a UDP connect sends nothing).
            local_addr = local_address_towards("192.0.2.1") or local_addr
        argv: List[str] = []
        failure_dir = tempfile.mkdtemp(prefix="mf-torchrun-")
        env = dict(os.environ)
        if function is not None:
            script, entry_argv = bootstrap.FUNCTION_FLAG, [function.encode(), failure_dir]
            _save_function_args(failure_dir, entrypoint_args)
            # Ranks import the function's module as the flow file would: from the
            # flow's directory.
            if self._flow_dir:
                env["PYTHONPATH"] = os.pathsep.join(
                    p for p in (self._flow_dir, env.get("PYTHONPATH")) if p
                )
        returns: Dict[int, Any] = {}
        env[bootstrap.FAILURE_DIR_ENV] = failure_dir
        env[bootstrap.NODE_INDEX_ENV] = str(topology.node_index)
        iface = interface_of(local_addr)
        if iface and "GLOO_SOCKET_IFNAME" not in env:
            # gloo otherwise binds to whatever the host name resolves to, which
            # on many hosts (127.0.1.1, containers) other nodes cannot reach.
            env["GLOO_SOCKET_IFNAME"] = iface
        # With the agent's store shared with the workers, torch keeps one store for
        # every restart and restarted workers read the previous round's addresses
        # (gloo: "Connection refused"): max_restarts could never recover. A fresh
        # store per round, hosted by rank 0, is what torch does with sharing off.
        env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        env[bootstrap.LABELS_ENV] = "1" if self._defaults.label_logs else "0"
        log_dir = _rank_log_dir(rdzv_id, topology.node_index)
        if log_dir:
            env[bootstrap.LOG_DIR_ENV] = log_dir
        gang_config = GangConfig(
            gang_id=rdzv_id,
            num_nodes=topology.num_nodes,
            heartbeat_timeout=self._defaults.heartbeat_timeout,
            start_timeout=self._defaults.start_timeout,
            progress_interval=_progress_interval(),
        )
        server = client = sup = None
        code: Optional[int] = None
        started = time.time()
        failures: List[RankFailure] = []
        cause: Optional[Dict[str, Any]] = None
        try:
            ports = topology.ports
            if topology.is_control:
                bind = _bind_host(topology)
                server = GangServer(
                    gang_config, bind, ports, announce={"rdzv_port": find_free_port(bind)}
                )
                server.progress = _say
                server.start()
                ports = (server.port,)
            client = GangClient(gang_config, topology.main_addr, ports, topology.node_index)
            client.connect()
            if client.cause is not None:
                raise GangAborted(topology.node_index, client.cause)
            argv = build_command(
                Launch(
                    python=sys.executable,
                    num_nodes=topology.num_nodes,
                    node_index=topology.node_index,
                    nproc_per_node=nproc,
                    rdzv_host=topology.main_addr,
                    rdzv_port=int(client.announce["rdzv_port"]),
                    rdzv_id=rdzv_id,
                    entrypoint=script,
                    entrypoint_argv=entry_argv,
                    user_options=options,
                    local_addr=local_addr,
                )
            )
            with Supervisor(argv, env=env) as sup:
                code = sup.wait(should_stop=client.abort_reason)
            ok = code == 0 and client.cause is None
            if code == 0 and (client.cause is None or server is None):
                # This node's ranks all succeeded: a worker node is done whatever
                # happens next; the control waits for the gang (below).
                if function is not None:
                    returns = functions.read_returns(failure_dir)
                rank0 = functions.result_path(failure_dir, 0)
                client.report_done(
                    _read_bytes(rank0) if os.path.exists(rank0) else None,
                    _node_report(failure_dir, [], log_dir, sup),
                )
                if server is not None:
                    # The control hosts the gang service: it stays until every node
                    # has finished, so that a late failure still reaches everyone.
                    client.wait_all_done(timeout=self._defaults.start_timeout)
                    if function is not None and 0 not in returns and server.rank0_pickle is not None:
                        functions.alias_flow_module()
                        returns[0] = pickle.loads(server.rank0_pickle)
                ok = client.cause is None or server is None
            if not ok:
                if code != 0:
                    failures = merge_failures(
                        read_failures(failure_dir),
                        parse_torchrun_summary(sup.stderr_tail, topology.node_index),
                    )
                    if client.cause is None:
                        client.report_failure(
                            _cause_from(topology.node_index, code, failures),
                            _node_report(failure_dir, failures, log_dir, sup),
                        )
                        # The service decides which failure is the root cause
                        # (it may wait for a better one than an echo); hear it.
                        deadline = time.monotonic() + gang_config.secondary_grace + 2.0
                        while client.cause is None and time.monotonic() < deadline:
                            time.sleep(0.02)
                cause = client.cause or _cause_from(topology.node_index, code, failures)
                _announce(cause, server)
                raise _error_for(cause, topology.node_index, code, failures, argv, function, failure_dir)
        finally:
            if client is not None:
                cause = client.cause
                client.close()
            gang_view: Dict[str, Any] = {}
            if server is not None:
                gang_view = {
                    "joined_at": dict(server.joined_at),
                    "finished_at": dict(server.finished_at),
                    "reports": dict(server.reports),
                }
                server.close()
            ranks = read_rank_records(failure_dir, failures)
            self.last_result = TorchrunResult(
                command=argv,
                node_index=topology.node_index,
                num_nodes=topology.num_nodes,
                nproc_per_node=nproc,
                exit_code=code,
                started_at=(sup.started_at if sup and sup.started_at else started),
                ended_at=(sup.ended_at if sup and sup.ended_at else time.time()),
                main_addr=topology.main_addr,
                local_addr=local_addr,
                rdzv_port=(client.announce.get("rdzv_port") if client else None),
                gang_port=(client.port if client else None),
                ranks=ranks,
                restarts=max([r.restart or 0 for r in ranks] or [0]),
                log_dir=log_dir,
                cause=cause,
                gang=gang_view,
                returns=returns,
            )
            shutil.rmtree(failure_dir, ignore_errors=True)
            in_flight = sys.exc_info()[1]
            if in_flight is not None:
                try:
                    in_flight.result = self.last_result  # type: ignore[attr-defined]
                except AttributeError:
                    pass
        return self.last_result


PROGRESS_ENV = "METAFLOW_TORCHRUN_PROGRESS_SECONDS"


def _progress_interval() -> float:
    try:
        return max(0.5, float(os.environ.get(PROGRESS_ENV, "15")))
    except ValueError:
        return 15.0


def _say(text: str) -> None:
    print("@torchrun: %s" % text, file=sys.stderr, flush=True)


TAIL_LINES = 20


def tail_lines(path: str, count: int = TAIL_LINES, max_bytes: int = 64 * 1024) -> List[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    return data.decode(errors="replace").splitlines()[-count:]


def _node_report(workdir: str, failures: List[RankFailure], log_dir: Optional[str], sup) -> Dict[str, Any]:
    """What this node tells the control when it finishes: its ranks and the last
    lines of their output (for the control's card)."""
    ranks = read_rank_records(workdir, failures)
    tails = {}
    for rec in ranks:
        if log_dir:
            tails[str(rec.rank)] = {
                s: tail_lines(os.path.join(log_dir, "rank-%d.%s.log" % (rec.rank, s)))
                for s in ("stdout", "stderr")
            }
    return {
        "ranks": [dict(vars(r)) for r in ranks],
        "tails": tails,
        "started": getattr(sup, "started_at", None),
        "ended": time.time(),
    }


def _rank_log_dir(rdzv_id: str, node_index: int) -> Optional[str]:
    """Per-rank copies of the output, kept after the run (the card shows their
    last lines; users can read them on the node)."""
    path = os.path.join(tempfile.gettempdir(), "metaflow-torchrun", rdzv_id, "node-%d" % node_index)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return None
    return path


def _function_reference(entrypoint: Any, args: Any) -> Optional[functions.FunctionRef]:
    if isinstance(entrypoint, (str, os.PathLike)) or not callable(entrypoint):
        return None
    try:
        ref = functions.reference_to(entrypoint)
        functions.split_args(args)
    except (functions.FunctionReferenceError, TypeError) as e:
        raise TorchrunInvalidArgument(str(e)) from None
    return ref


def _save_function_args(directory: str, args: Any) -> None:
    try:
        functions.write_pickle(os.path.join(directory, bootstrap.ARGS_FILE), args)
    except Exception as e:
        raise TorchrunInvalidArgument(
            "entrypoint_args cannot be pickled for the ranks: %s" % e
        ) from None


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _original_exception(function, directory: str, error: TorchrunFailed) -> Optional[BaseException]:
    """For a function entrypoint, the failing rank's own exception object."""
    if function is None or error.root_cause is None:
        return None
    exc = functions.read_exception(directory, error.root_cause.rank)
    return functions.with_rank(exc, error.root_cause.rank) if exc is not None else None


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _bind_host(topology: Topology) -> str:
    if topology.is_local:
        return "127.0.0.1"
    return "::" if ":" in topology.main_addr else "0.0.0.0"


def _cause_from(node_index: int, code: int, failures: List[RankFailure]) -> Dict[str, Any]:
    if failures:
        first = failures[0]
        summary = first.summary()
        return {
            "kind": "failed",
            "node_index": node_index,
            "exit_code": code,
            "rank": first.rank,
            "local_rank": first.local_rank,
            "exc_type": first.exc_type,
            "message": first.message,
            "secondary": first.secondary,
            "summary": summary,
        }
    return {
        "kind": "failed",
        "node_index": node_index,
        "exit_code": code,
        "summary": "node %d: torchrun ended with %s" % (node_index, describe_exit_code(code)),
    }


def _error_for(
    cause: Dict[str, Any],
    node_index: int,
    code: int,
    failures: List[RankFailure],
    argv: List[str],
    function: Optional[functions.FunctionRef],
    workdir: str,
) -> BaseException:
    """The exception this node's step raises: the failure itself on the node where
    the root cause is (for a function, the rank's own exception), and on the
    others a ``GangAborted`` naming it."""
    if cause.get("kind") == "failed" and cause.get("node_index") == node_index:
        error = TorchrunFailed(code, node_index, failures, argv)
        original = _original_exception(function, workdir, error)
        if original is not None:
            original.__cause__ = error
            return original
        return error
    return GangAborted(node_index, cause, code)


def _announce(cause: Dict[str, Any], server) -> None:
    """The control prints the gang's root cause once, apart from the interleaved
    logs, so it is the first thing a reader of the control task's log finds."""
    if server is None:
        return
    bar = "=" * 72
    print(
        "\n%s\n@torchrun: the gang failed. Root cause: %s\n%s"
        % (bar, cause.get("summary") or cause.get("kind"), bar),
        file=sys.stderr,
        flush=True,
    )
