"""Runs torchrun's agent (``torch.distributed.run``), its store kept on loopback
when the rendezvous endpoint is a loopback address: torch's TCPStore listens on
every interface, and a store opened here first (``master_listen_fd``) is the one
its rendezvous handlers reuse (``multi_tenant=True``).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # torchrun's stand-in: the warm process runs the agent, and nothing below is imported
    from .handoff import stand_in

    stand_in("agent")

import datetime
import logging
import os
import signal
import socket
import time
import traceback
from typing import IO, Any, Dict, List, Mapping, NoReturn, Optional, Sequence

from ..host.network import is_loopback
from ..host.private import open_private
from ..base import timeouts
from . import departure, exits
from .failures import AgentFailure, write_agent_failures
from .names import USER_UMASK_ENV, WORK_DIR_ENV, LOG_DIR_ENV, agent_log_path

LAUNCHER_LOGGERS = ("torch.distributed.run", "torch.distributed.elastic", "torch.distributed.launcher")

# Those torch's agent raises on (``PContext.start``): ignored once it is ending.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)

# The store we opened must outlive torch's use of it: the agent's whole life.
_KEEP: List[Any] = []


def _conf(text: str) -> dict:
    pairs = (item.partition("=") for item in (text or "").split(","))
    return {key.strip(): value.strip().lower() for key, sep, value in pairs if sep}


def hosted_store(args: Any) -> Optional[tuple]:
    """``(host, port)`` of the store this agent hosts on a loopback endpoint; else torch's."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    endpoint = args.rdzv_endpoint or ""
    if not endpoint or not hosts_store(args):
        return None
    host, port = parse_rendezvous_endpoint(endpoint, default_port=-1)
    if port <= 0 or not is_loopback(host):
        return None
    return host, port


def hosts_store(args: Any) -> bool:
    """Node 0 of the static rendezvous, or the c10d node with ``is_host`` set
    (where a user's ``rdzv_conf`` leaves torch to guess, no)."""
    if args.rdzv_backend == "static":
        return str(args.node_rank).strip() == "0"
    if args.rdzv_backend == "c10d":
        conf = _conf(args.rdzv_conf)
        return conf.get("store_type", "tcp") == "tcp" and conf.get("is_host") in ("1", "true", "yes", "y")
    return False


def open_loopback_store(host: str, port: int) -> Any:
    """A TCPStore server listening on ``host`` only (torch's own would listen on all)."""
    from torch.distributed import TCPStore

    name = host.strip("[]")
    family = socket.AF_INET6 if ":" in name else socket.AF_INET
    if name == "localhost":
        name, family = "127.0.0.1", socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((name, port))
    except OSError:
        sock.close()
        raise
    return TCPStore(host, port, is_master=True, multi_tenant=True, master_listen_fd=sock.detach(),
                    wait_for_workers=False, timeout=datetime.timedelta(seconds=60))


def keep_ranks_store_on_loopback(env: Mapping[str, str]) -> None:
    """Rank 0 hosts the ranks' own store where the agent's is not shared
    (``max_restarts`` above 0, plan.py): opened here first, ``init_process_group`` reuses it."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "False" or env.get("RANK") != "0":
        return
    host, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    if not is_loopback(host) or not port.isdigit():
        return
    try:
        _KEEP.append(open_loopback_store(host, int(port)))
    except Exception:
        pass  # torch's own store then reports whatever is wrong, in its words


class _LogHandler(logging.StreamHandler):
    """A stop signal landing while torch's agent writes a line (its error file's, as its ranks fail) raises
    torch's ``SignalException`` inside the write; logging swallows it either way, but by default prints
    "--- Logging error ---" and two tracebacks on the console, which is the user's."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


def quiet_launcher(log_dir: Optional[str]) -> Optional[IO[str]]:
    """torchrun's own lines only repeat our root cause: they wait in the node's
    agent log (a failed rank's traceback stays on the console)."""
    if not log_dir:
        return None
    path = agent_log_path(log_dir)
    try:
        log = os.fdopen(open_private(path), "a", encoding="utf-8", errors="replace")
    except OSError:
        return None
    handler = _LogHandler(log)
    handler.setFormatter(logging.Formatter("%(levelname).1s %(asctime)s %(name)s] %(message)s"))
    for name in LAUNCHER_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.propagate = False
    return log


def native_stderr_to_log(log: Optional[IO[str]]) -> bool:
    """torch's C++ lines on the agent's fd 2 go to its log too. Its workers and
    Python's ``sys.stderr`` keep the console; False, nothing changed, where
    this torch has no worker ``Popen`` to hand the console to."""
    if log is None:
        return False
    try:
        from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler as handler
    except ImportError:
        return False
    popen = getattr(handler, "Popen", None)
    if popen is None:
        return False
    encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
    sys.stderr.flush()
    console = os.dup(2)

    def worker_popen(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("stderr") is None:  # torch's redirects (a file) are left as they are
            kwargs["stderr"] = console
        return popen(*args, **kwargs)

    handler.Popen = worker_popen
    sys.stderr = os.fdopen(console, "w", buffering=1, encoding=encoding, errors="backslashreplace", closefd=False)
    os.dup2(log.fileno(), 2)
    return True


def worker_exits(pcontext: Any) -> Dict[int, int]:
    """pid -> exit status of every worker a torchelastic process context reaped."""
    out: Dict[int, int] = {}
    procs = [(getattr(h, "proc", None), "returncode")
             for h in dict(getattr(pcontext, "subprocess_handlers", None) or {}).values()]
    procs += [(p, "exitcode") for p in list(getattr(getattr(pcontext, "_pc", None), "processes", None) or [])]
    for proc, attribute in procs:
        pid, code = getattr(proc, "pid", None), getattr(proc, attribute, None)
        if isinstance(pid, int) and isinstance(code, int):
            out[pid] = code
    return out


def record_worker_exits(directory: Optional[str]) -> bool:
    """Complete each rank's status with the exit torch reaped: ``PContext.close``
    stops and waits for the workers on every path. False where this torch has none."""
    if not directory:
        return False
    try:
        from torch.distributed.elastic.multiprocessing import api
    except ImportError:
        return False
    original = getattr(api.PContext, "close", None)
    if original is None or getattr(original, "_torchrun_records_exits", False):
        return False

    def close(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        finally:
            try:
                exits.complete(directory, worker_exits(self), time.time())
            except Exception:
                pass  # a record is a bonus: the agent's shutdown must go on

    close._torchrun_records_exits = True  # type: ignore[attr-defined]
    api.PContext.close = close
    return True


def record_child_failures(directory: Optional[str], error: Any) -> bool:
    """For ranks that could not record their own failure (``failures.read_agent_failures``).
    Never raises: torch's own handling goes on."""
    if not directory:
        return False
    try:
        host = socket.gethostname()
        found = [AgentFailure.of(rank, failure, host) for rank, failure in dict(error.failures).items()]
        write_agent_failures(directory, found)
    except Exception:
        return False
    return True


def main(argv: Sequence[str]) -> None:
    """torchrun's agent, run here (its stand-in found no warm process) or forked from the node's."""
    os.environ[USER_UMASK_ENV] = "%03o" % os.umask(0o077)  # torch's files private; the ranks get the user's back
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = run.get_args_parser().parse_args(list(argv))
    log = quiet_launcher(os.environ.get(LOG_DIR_ENV))
    native_stderr_to_log(log)
    where = hosted_store(args)
    if where is not None:
        _KEEP.append(open_loopback_store(*where))
    record_worker_exits(os.environ.get(WORK_DIR_ENV))
    departure.watch_exit_barrier()
    try:
        run.main(list(argv))
        leave_store(hosts_store(args), log)
    except (ChildFailedError, SignalException) as e:
        try:
            end_failed(e, log, isinstance(e, ChildFailedError))
        finally:  # whatever was raised ending (a signal before it was ignored), the node's exit says it failed
            exit_now(1, log)
    exit_now(0, log)  # the job is done on every node: past torch's exit barrier and its store


def end_failed(error: BaseException, log: Optional[IO[str]], ranks_failed: bool) -> None:
    """Called in the handler of torch's error, its ranks stopped and reaped. A node's
    ranks failing as echoes and the gang's stop reach it together: torch's handlers
    would raise again here, and print its whole report and a second traceback on the console."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if ranks_failed:
        record_child_failures(os.environ.get(WORK_DIR_ENV), error)
    if log is None:  # torch's own report, as its torchrun prints it
        exit_now(1, None, traceback.format_exc())
    # In the log, only the exception's text: the node's error says the cause in the user's frames.
    log.write("".join(traceback.format_exception_only(type(error), error)))


def leave_store(hosts: bool, log: Optional[IO[str]]) -> None:
    """The store's host stays until every other agent is done with it (``departure.py``)."""
    if departure.depart(hosts, timeouts.DEPART_WAIT) is False and hosts and log is not None:
        log.write("not every other agent said it was done with the rendezvous store within %g s: "
                  "leaving anyway\n" % timeouts.DEPART_WAIT)


def exit_now(code: int, log: Optional[IO[str]], report: str = "") -> NoReturn:
    """Skip the interpreter tearing torch down (seconds under load, the node
    waiting): every rank is reaped and recorded by now."""
    try:
        if report:
            sys.stderr.write(report)
        for stream in (log, sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    finally:
        os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
