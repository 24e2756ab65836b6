"""Runs first in every rank, then the user's script as ``python script.py`` would.

Users need not decorate their ``main`` with torch's ``@record``: an exception
escaping the script is recorded (ours and torchelastic's error file), then re-raised.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # torchrun's stand-in: the warm process runs the rank, and nothing below is imported
    from .handoff import stand_in

    stand_in("bootstrap", tie=True)

import builtins
import faulthandler
import os
import runpy
import socket
import time
import traceback
import types

from . import agent, arrivals, entry, flight_ask, group_keeper, handoff, relay, stacks
from .names import (ARGS_FILE, WORK_DIR_ENV, LABELS_ENV, LOG_DIR_ENV, NODE_INDEX_ENV, RESTART_COUNT_ENV, RESTART_ENV,
                    SNAPSHOT_ENV, rank_log_path)
from .failures import RankFailure, write_failure
from .status import RankStatus, write_status
from .failure_block import is_users
from ..host.private import open_private
from ..host import title


def _env_int(name: str, default: int = -1) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def user_traceback(exc: BaseException, script: str = "") -> str:
    """As running their code directly shows it: our, runpy's and torch's frames are noise."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    target = os.path.abspath(script) if script else None
    at = next((i for i, f in enumerate(te.stack) if os.path.abspath(f.filename) == target), 0)
    te.stack = traceback.StackSummary.from_list(list(te.stack)[at:])
    seen = set()
    todo = [te]
    while todo:
        one = todo.pop()
        if id(one) in seen:
            continue
        seen.add(id(one))
        frames = [f for f in one.stack if is_users(f.filename)]
        one.stack = traceback.StackSummary.from_list(frames or list(one.stack))
        todo.extend(x for x in (one.__cause__, one.__context__) if x is not None)
    return "".join(te.format())


def report_failure(formatted: str) -> None:
    """To the rank's log only (relay.py): the node's error shows the cause once.
    Where torchrun may restart the ranks no error will, so it shows."""
    restarts = _env_int("TORCHELASTIC_MAX_RESTARTS", 0)
    quiet = os.environ.get(LOG_DIR_ENV) and _env_int("TORCHELASTIC_RESTART_COUNT", 0) >= restarts
    text = formatted if formatted.endswith("\n") else formatted + "\n"
    if quiet:
        text = relay.LOG_ONLY_BEGIN.decode() + text + relay.LOG_ONLY_END.decode()
    try:
        sys.stderr.flush()
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _record(exc: BaseException, formatted: str) -> None:
    directory = os.environ.get(WORK_DIR_ENV)
    if directory:
        try:
            write_failure(directory, RankFailure(
                rank=_env_int("RANK"), local_rank=_env_int("LOCAL_RANK"), node_index=_env_int(NODE_INDEX_ENV),
                host=socket.gethostname(), pid=os.getpid(), exc_type=type(exc).__name__, message=str(exc),
                traceback=formatted, timestamp=time.time()))
        except OSError:
            pass
    target = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if target:
        torch_error_file(target, exc)


def torch_error_file(target: str, exc: BaseException) -> None:
    """torch's own record of the exception, whole or not at all. torch's agent reads
    it as soon as the rank's process ends; written in place, a stop (the agent's
    SIGTERM to the other ranks) between its open and its write left it empty, and
    the agent crashed parsing it, its traceback on the user's screen."""
    tmp = "%s.%d.tmp" % (target, os.getpid())
    try:
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler  # torch only where a rank uses it

        class _Aside(ErrorHandler):
            def _get_error_file_path(self) -> str:
                return tmp

        _Aside().record_exception(exc)
        os.replace(tmp, target)
    except Exception:
        try:
            os.unlink(tmp)
        except OSError:
            pass


FUNCTION_FLAG = "--mf-function"


def run_function(ref_text: str, workdir: str) -> None:
    """Call the function with the pickled arguments; pickle what it returns or raises."""
    from . import functions  # the rank-start boundary: a function's run alone loads it

    rank = _env_int("RANK")
    try:
        fn = functions.load(functions.FunctionRef.decode(ref_text))
        args, kwargs = functions.split_args(functions.read_pickle(os.path.join(workdir, ARGS_FILE)))
        value = fn(*args, **kwargs)
    except SystemExit:
        raise
    except BaseException as e:
        formatted = user_traceback(e)
        _record(e, formatted)
        try:
            functions.write_pickle(functions.exception_path(workdir, rank), e)
        except Exception:
            pass  # an exception that cannot be pickled is still named in the record
        report_failure(formatted)
        sys.exit(1)
    try:
        functions.write_pickle(functions.result_path(workdir, rank), value)
    except Exception as e:
        err = TypeError("rank %d: the return value of %s cannot be pickled: %s" % (rank, ref_text, e))
        _record(err, "%s: %s\n" % (type(err).__name__, err))
        raise err from e


def show_command(argv: list) -> bool:
    """What ``ps`` and ``pgrep -f`` show: the command torchrun would have run
    without us, or ``python -u <module>:<function>``. True where the whole title shows."""
    if argv[:1] == [FUNCTION_FLAG] and len(argv) == 3:
        from . import functions  # the rank-start boundary: a function's run alone

        try:
            ref = functions.FunctionRef.decode(argv[1])
        except ValueError:
            return False
        return title.show([sys.executable, "-u", "%s:%s" % (ref.target, ref.qualname)],
                          ref.qualname.rsplit(".", 1)[-1])
    if not argv:
        return False
    return title.show([sys.executable, "-u", *argv], os.path.basename(argv[0]))


def _status(status: RankStatus) -> None:
    directory = os.environ.get(WORK_DIR_ENV)
    if directory:
        write_status(directory, status)


def _crash_dumps_to_log(rank: int, log_dir) -> None:
    """To the rank's stderr log, which the node's error shows: not the console a second time."""
    if log_dir:
        try:
            fd = open_private(rank_log_path(log_dir, rank, "stderr"))
            _KEEP.append(fd)
            faulthandler.enable(file=fd)
            return
        except OSError:
            pass
    faulthandler.enable()

_KEEP: list = []  # the stack file stays open for the rank's life


def main(argv: list) -> None:
    """The rank, run here: tied to its agent already (by its stand-in, or by the warm process's fork)."""
    title.prepare()  # a fresh rank's, before its environment changes (a forked one's was the zygote's)
    try:
        argv, trainer_progress, read_arrivals = entry.bootstrap_entry(argv)
    except (OSError, ValueError) as e:
        sys.stderr.write("@torchrun bootstrap: cannot read what to run: %s\n" % e)
        sys.exit(2)
    entry.restore_user_tmpdir()
    agent.keep_ranks_store_on_loopback(os.environ)
    if os.environ.get(RESTART_ENV):
        # The gang's restart k runs a fresh torchrun, whose count says 0.
        os.environ[RESTART_COUNT_ENV] = os.environ[RESTART_ENV]
    rank = _env_int("RANK")
    labels = os.environ.get(LABELS_ENV, "1") != "0"
    log_dir = os.environ.get(LOG_DIR_ENV)
    if labels or log_dir:
        # The relay, forked next, keeps this title: `pgrep -f train.py` finds the rank alone.
        title.show(["mftr-relay", "rank", str(rank)], "mftr-relay")
        relay.start(rank, labels, log_dir)
    show_command(argv)
    relay.whole_line_prints()
    _crash_dumps_to_log(rank, log_dir)
    _KEEP.append(stacks.register(os.environ.get(WORK_DIR_ENV), rank))
    if flight_ask.recording(os.environ):
        flight_ask.listen(os.environ.get(WORK_DIR_ENV), rank)
        if read_arrivals:
            _KEEP.append(arrivals.watch(os.environ.get(WORK_DIR_ENV), rank))
    if trainer_progress:
        from . import trainer_hooks  # the rank-start boundary: where progress is on

        trainer_hooks.install()
    if handoff.FORKED:  # it ends without destructors (zygote.exit_warm): a group held is never torn down
        group_keeper.install()
    if os.environ.get(SNAPSHOT_ENV):  # set where the step keeps snapshots: the trainers' callbacks save them
        from ..snapshots.rank import trainers

        trainers.install()
    started = RankStatus(rank=rank, local_rank=_env_int("LOCAL_RANK"), group_rank=_env_int("GROUP_RANK"),
                         restart=_env_int("TORCHELASTIC_RESTART_COUNT", 0), pid=os.getpid(), start=time.time())
    _status(started)
    code = 1
    try:
        _main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        raise
    finally:
        _status(started.ended(code, time.time()))


# The module the process started as: kept, since the script's takes its place as __main__ for good.
_STARTED_AS: list = []


def run_as_main(script: str) -> None:
    """In a module that stays ``__main__`` until the process ends, so what the
    script left is released in order. ``runpy.run_path`` drops its module at
    once, and the collector may then close a file's buffer before its text
    layer, losing its last writes (CPython bpo-17852). A directory or zip goes to runpy."""
    if not os.path.isfile(script):
        runpy.run_path(script, run_name="__main__")
        return
    with open(script, "rb") as f:
        source = f.read()
    code = compile(source, script, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=script, __cached__=None, __loader__=None, __package__=None, __spec__=None,
                         __builtins__=builtins)
    _STARTED_AS.append(sys.modules.get("__main__"))
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def release_main() -> None:
    """What Python's shutdown does first to ``__main__``: names with one leading
    underscore set to None first, then the rest but ``__builtins__``."""
    main = sys.modules.get("__main__")
    if main is None or not _STARTED_AS:
        return
    names = getattr(main, "__dict__", {})
    for first in (True, False):
        for name in list(names):
            if name == "__builtins__" or (name.startswith("_") and not name.startswith("__")) != first:
                continue
            try:
                names[name] = None
            except Exception:
                pass


def _main(argv: list) -> None:
    if argv[:1] == [FUNCTION_FLAG] and len(argv) == 3:
        run_function(argv[1], argv[2])
        return
    if not argv:
        sys.stderr.write("usage: python -m %s SCRIPT [ARGS...]\n" % __name__)
        sys.exit(2)
    script = argv[0]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        run_as_main(script)
    except SystemExit as e:
        if e.code not in (None, 0):
            _record(e, "")
        raise
    except BaseException as e:
        formatted = user_traceback(e, script)
        _record(e, formatted)
        report_failure(formatted)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
