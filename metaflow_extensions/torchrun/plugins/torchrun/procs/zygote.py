"""The node's warm process (issue 37): imports torch once, then forks torchrun's
agent and every rank, each spared about 2.5 CPU-seconds of ``import torch``.
Safe because nothing runs here before a fork but the import (``fork_guard.py``),
and the child is made what a fresh process would be (``become``). Who asks is a
stand-in (``handoff.py``). Run as ``python -u -m <this module> SOCKET``.
"""

from __future__ import annotations

import atexit
import gc
import os
import selectors
import signal
import socket
import sys
import time

from ..host.proctree import die_with_parent, name_this_process
from ..host import namespaces, title
from ..host.unix_socket import bind_unix
from . import handoff, warm_imports
from .fork_guard import ForkGuard
from .names import WORK_DIR_ENV, ZYGOTE_ENV, ZYGOTE_NAME, ZYGOTE_PID_SUFFIX
from .zygote_wire import Request, WireError, recv_request, reply

TYPE_CHECKING = False  # typing unimported: a zygote's stand-in loads this before it hands off (handoff.py)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, NoReturn, Optional, Tuple

_WARMED_THREADS: Optional[str] = None
_IMPORT_ENV: Dict[str, str] = {}
_IMPORT_PREFIXES = ("TORCH", "PYTORCH", "CUDA", "NCCL", "GLOO", "OMP_", "MKL_", "KMP_", "LD_", "PYTHON")
_NOT_AT_IMPORT = ("OMP_NUM_THREADS", "PYTHONUNBUFFERED")  # a child sets its own; Metaflow's tasks have it
_REQUEST_SECONDS = 5.0  # a stand-in sends its request as it connects
_FRESH_NAME = b""  # this process's name before it called itself a zygote: its children get it back
_GUARD: Optional[ForkGuard] = None
_SOCKET = ""  # this warm process's socket: what its warmer does is written beside it
_KEPT: List[socket.socket] = []  # a warmer's end of its socket to the warm process: open for its life


def listen(path: str) -> socket.socket:
    """Bound before torch is imported: stand-ins that come early wait in the backlog."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    try:
        bind_unix(sock, path)
    finally:
        os.umask(old)
    sock.listen(128)
    return sock


def warm(aside: str) -> None:
    """An import that fails is left to the child, to fail in its own words. ``aside``: a
    private directory of ours, where torch's compiler stack makes its cache directory as it loads."""
    global _WARMED_THREADS, _IMPORT_ENV
    _WARMED_THREADS = os.environ.get("OMP_NUM_THREADS")
    _IMPORT_ENV = import_env(os.environ)
    try:
        import torch
        import torch.distributed.run  # noqa: F401  (torchrun's agent)

        # A script's first optimizer imports torch's compiler stack (torch._dynamo, sympy: about 830
        # modules, 1.1 to 2.3 CPU-s on the 2-core test machine), which a restart paid before its first step.
        # Ranks that start sooner end sooner too, into a gloo teardown that can deadlock: group_keeper.py.
        with _cache_dir_aside(aside):
            torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    except Exception:
        pass
    # What every child runs, imported once here, not in each agent and rank (0.05 CPU-s each):
    # nothing of theirs reads the environment or starts a thread as it loads.
    from . import agent, bootstrap  # noqa: F401
    # Out of the collector's sight, a child neither copies these pages nor
    # collects them at its exit (0.75 s down to 0.14 s here).
    gc.freeze()


class _cache_dir_aside:
    """torch._dynamo makes torch's cache directory as it loads (``torchinductor_<user>`` in
    TMPDIR, torch 2.13): for the throwaway optimizer, a directory of ours, removed after, and
    torch's variable unset again, so a rank finds its own (a job that never imports the
    compiler stack leaves nothing in the user's TMPDIR). A directory the user named is theirs."""

    _VAR = "TORCHINDUCTOR_CACHE_DIR"

    def __init__(self, parent: str) -> None:
        self.path = "" if self._VAR in os.environ else os.path.join(parent, "torch-cache")

    def __enter__(self) -> None:
        if self.path:
            os.environ[self._VAR] = self.path

    def __exit__(self, *_: Any) -> None:
        if not self.path:
            return
        os.environ.pop(self._VAR, None)
        import shutil  # torch imported it already

        shutil.rmtree(self.path, ignore_errors=True)


def import_env(env: Mapping[str, str]) -> Dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_IMPORT_PREFIXES) and k not in _NOT_AT_IMPORT}


def refusal(request: Request) -> Optional[str]:
    """Another interpreter, or a zygote for an environment torch's import could
    read differently (``@environment``, ``@pypi``), imports its own."""
    if request.executable != sys.executable:
        return "another interpreter: %s" % request.executable
    if request.module == "zygote" and import_env(request.env) != _IMPORT_ENV:
        return "another environment at import"
    return None


class _Refused(WireError):
    def __init__(self, why: str, fds: List[int]):
        super().__init__(why)
        self.fds = fds


class _Warmer:
    """A fork of this warm process importing what a rank of the first start had loaded
    (warm_imports.py); it forks the node's agents and ranks once it is done and fit to."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid, self.sock = pid, sock
        self.began = time.monotonic()
        self.serving = False
        self.said = b""

    def left(self) -> Optional[float]:
        return None if self.serving else max(0.0, self.began + warm_imports.SECONDS - time.monotonic())

    def overdue(self) -> bool:
        return not self.serving and time.monotonic() - self.began > warm_imports.SECONDS


class Server:
    def __init__(self, listener: socket.socket, learned: bool = False):
        self.listener = listener
        self.children: Dict[int, Tuple[Optional[socket.socket], Request]] = {}
        self.learned = learned  # a rank's modules are learned once (a warmer has them)
        self.warmer: Optional[_Warmer] = None
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "reap")

    def serve(self) -> Tuple[Request, List[int]]:
        """Runs until this process is killed; returns only in a forked child."""
        while True:
            for key, _ in self.selector.select(self.warmer.left() if self.warmer is not None else None):
                if key.data == "accept":
                    forked = self._accept()
                    if forked is not None:
                        return forked
                elif key.data == "reap":
                    self._drain_wake()
                    self.reap()
                elif key.data == "warmer":
                    self._hear_warmer()
                else:
                    self._stand_in_gone(key.data)
            if self.warmer is not None and self.warmer.overdue():
                self._end_warmer("still importing after %.0f s" % warm_imports.SECONDS)

    def _accept(self) -> Optional[Tuple[Request, List[int]]]:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return None
        fds: List[int] = []
        try:
            peer, uid = handoff.peer_credentials(conn)
            if uid != os.getuid():
                raise WireError("a peer of another user")
            conn.settimeout(_REQUEST_SECONDS)
            request, fds = recv_request(conn)
            if request.module == "imports":  # an offer, not a start: nothing is forked for it here
                for fd in fds:
                    os.close(fd)
                conn.close()
                return self._learn(request)
            why = refusal(request) or (_GUARD.hazard(sys.modules) if _GUARD is not None else None)
            handles, why = ({}, why) if why is not None else namespaces.to_join(peer)
            if why is not None:
                raise _Refused(why, fds)
        except (OSError, WireError) as e:
            if isinstance(e, _Refused):  # the stand-in starts fresh: say why in this zygote's log
                sys.stderr.write("a start refused, the stand-in starts fresh: %s\n" % e)
            for fd in getattr(e, "fds", fds):
                os.close(fd)
            conn.close()
            return None
        pid = self._fork(conn)
        if pid == 0:
            conn.close()
            self._leave()
            _join(handles)
            return request, fds
        namespaces.close_handles(handles)
        for fd in fds:
            os.close(fd)
        if pid is None:
            conn.close()
            return None
        conn.settimeout(None)
        self.children[pid] = (conn, request)
        try:
            conn.sendall(reply("pid", pid))
            self.selector.register(conn, selectors.EVENT_READ, pid)
        except OSError:
            self._stand_in_gone(pid)
        return None

    def _fork(self, conn: socket.socket) -> Optional[int]:
        """"taken" first: a stand-in that then hears nothing more knows a child
        may have run, and does not start the module again itself."""
        try:
            conn.sendall(reply("taken", 1))
        except OSError:
            return None
        try:
            return os.fork()
        except OSError as e:
            sys.stderr.write("no fork (%s): the stand-in starts fresh\n" % e)
            try:
                conn.sendall(reply("fresh", 1))
            except OSError:
                pass
            return None

    def _learn(self, request: Request) -> Optional[Tuple[Request, List[int]]]:
        """Once: a fork of this process imports what a rank had loaded by its first step. This one
        stops accepting meanwhile (a restart's stand-ins wait in the backlog, bounded by
        ``warm_imports.SECONDS``), then the fork serves them, or this one again where it is not fit."""
        if self.learned or refusal(request) is not None or (_GUARD is not None and _GUARD.hazard(sys.modules)):
            return None  # where this process may not fork its children, it forks no warmer either
        self.learned = True
        names = warm_imports.asked(request.argv)
        try:
            mine, theirs = socket.socketpair()
        except OSError:
            return None
        if not names:
            mine.close()
            theirs.close()
            return None
        self.selector.unregister(self.listener)
        try:
            pid = os.fork()
        except OSError as e:
            pid = -1
            _note({"gave_up": "no fork: %s" % e})
        if pid == 0:
            mine.close()
            return self._warm_more(names, theirs, request)
        theirs.close()
        if pid < 0:
            mine.close()
            self.selector.register(self.listener, selectors.EVENT_READ, "accept")
            return None
        self.warmer = _Warmer(pid, mine)
        self.selector.register(mine, selectors.EVENT_READ, "warmer")
        sys.stderr.write("learning %d modules a rank had loaded by its first step: in pid %d\n" % (len(names), pid))
        return None

    def _warm_more(self, names: List[str], conn: socket.socket, request: Request) -> Tuple[Request, List[int]]:
        """In the fork: imports ``names``, says whether it is fit to fork, and serves once told to
        (returns only in a child it forked); otherwise it ends."""
        global _GUARD
        parent = os.getppid()
        self._leave(keep_listener=True)
        die_with_parent()  # as every child of the warm process
        if os.getppid() != parent:
            os._exit(1)
        _GUARD = ForkGuard(inherited=True)  # threads made here from now on are the imports'
        _GUARD.warmed()
        cuda = warm_imports.cuda_driver_loaded()
        began = time.monotonic()
        users = warm_imports.user_dirs(request.cwd, request.path[0] if request.path else "")
        done, skipped = warm_imports.import_learned(names, users + warm_imports.user_dirs(os.getcwd(), ""),
                                                    began + warm_imports.SECONDS)
        gc.freeze()
        why = _GUARD.hazard(sys.modules) or (
            "its imports loaded CUDA's driver" if not cuda and warm_imports.cuda_driver_loaded() else None)
        said = "unfit: %s" % why if why else "ready %d %d %.2f" % (done, skipped, time.monotonic() - began)
        try:
            conn.sendall(said.encode()[:1000] + b"\n")
            go = conn.recv(1) if why is None else b""
        except OSError:
            go = b""
        if go != b"G":
            os._exit(0)
        _KEPT.append(conn)  # its end, once this process is gone, tells the warm process
        return Server(self.listener, learned=True).serve()

    def _hear_warmer(self) -> None:
        warmer = self.warmer
        assert warmer is not None
        try:
            data = warmer.sock.recv(1024)
        except OSError:
            data = b""
        warmer.said += data
        if not data or len(warmer.said) > 1024:
            self._end_warmer("ended" if warmer.serving else "ended before it was done")
            return
        if b"\n" not in warmer.said or warmer.serving:
            return
        line = warmer.said.partition(b"\n")[0].decode(errors="replace")
        words = line.split()
        if words[:1] != ["ready"] or len(words) != 4 or warmer.overdue():
            self._end_warmer(line if not words[:1] == ["ready"] else "done too late")
            return
        try:
            warmer.sock.sendall(b"G")
        except OSError:
            self._end_warmer("gone as it was done")
            return
        warmer.serving = True
        _note({"pid": warmer.pid, "modules": int(words[1]), "skipped": int(words[2]), "seconds": float(words[3])})
        sys.stderr.write("pid %d imported %s modules (%s skipped) in %s s: it forks this node's agents and ranks "
                         "from now on\n" % (warmer.pid, words[1], words[2], words[3]))

    def _end_warmer(self, why: str) -> None:
        """The one place a warmer is given up on: killed (one that served is gone already), and this
        process forks the node's agents and ranks again, as before."""
        warmer, self.warmer = self.warmer, None
        if warmer is None:
            return
        self.selector.unregister(warmer.sock)
        warmer.sock.close()
        try:
            os.kill(warmer.pid, signal.SIGKILL)
        except OSError:
            pass
        _note({"gave_up": why})
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        sys.stderr.write("the warmer (pid %d) %s: this node's agents and ranks fork from this process, as "
                         "before\n" % (warmer.pid, why))

    def _drain_wake(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except OSError:
            pass

    def reap(self) -> None:
        """A rank's status is completed before it is reaped: whoever waits for the pid sees it."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or not info.si_pid:
                return
            pid = info.si_pid
            code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            if self.warmer is not None and pid == self.warmer.pid:  # while its pid is still its own
                self._end_warmer("ended (%d)" % code)
            conn, request = self.children.pop(pid, (None, None))
            if request is not None and request.module == "bootstrap":
                _complete_status(request, pid, code)
            os.waitpid(pid, 0)
            if conn is not None:
                try:
                    conn.sendall(reply("exit", code))
                except OSError:
                    pass
                self._forget(conn)

    def _stand_in_gone(self, pid: int) -> None:
        """Its child goes too, as a rank with its agent; one reaped already is
        not signalled (its pid may be another process's)."""
        if pid not in self.children:
            return
        conn, request = self.children[pid]
        if conn is not None:
            self._forget(conn)
            self.children[pid] = (None, request)
        for kill in (os.killpg, os.kill):  # its own group, once it has made one
            try:
                kill(pid, signal.SIGKILL)
                break
            except OSError:
                continue

    def _forget(self, conn: socket.socket) -> None:
        try:
            self.selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def _leave(self, keep_listener: bool = False) -> None:
        """A stand-in must see EOF when the zygote is gone."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for conn, _ in self.children.values():
            if conn is not None:
                conn.close()
        if self.warmer is not None:
            self.warmer.sock.close()
        for kept in _KEPT:  # a warmer's child: not its parent's end to the warm process
            kept.close()
        self.selector.close()
        if not keep_listener:
            self.listener.close()
        os.close(self.wake_r)
        os.close(self.wake_w)


def _join(handles: Dict[str, int]) -> None:
    """Where the stand-in lives (host/namespaces.py). The stand-in heard "taken": a child
    that cannot live there ends as a failed start rather than run in the wrong network."""
    try:
        namespaces.join(handles)
    except OSError as e:
        sys.stderr.write("a forked child could not join its stand-in's namespaces: %s\n" % e)
        os._exit(1)


def _complete_status(request: Request, pid: int, code: int) -> None:
    directory = request.env.get(WORK_DIR_ENV)
    if directory:
        from . import exits  # the rank-start boundary: a stand-in loads this module

        try:
            exits.complete(directory, {pid: code}, time.time())
        except Exception:
            pass  # a record is a bonus; the stand-in still reports the exit


# Signals a fresh process starts with at their defaults (Python's own for SIGINT).
_RESET = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD,
          signal.SIGPIPE, signal.SIGXFSZ)


def become(request: Request, fds: List[int]) -> None:
    """Be what ``python -m <module> ARGV`` would have been in the stand-in's
    place, then run it."""
    os.setsid()
    zygote = os.getppid()
    die_with_parent()  # as a fresh agent dies with its supervisor, and a rank with its agent
    if os.getppid() != zygote:
        os._exit(1)  # the zygote went before we asked
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    for sig in _RESET:
        signal.signal(sig, signal.SIG_IGN if sig in (signal.SIGPIPE, signal.SIGXFSZ) else signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    if request.module != "zygote" and _FRESH_NAME:
        name_this_process(_FRESH_NAME)  # as `python` started it
    if request.module == "agent":  # what ps shows: its command, not ours (host/title.py)
        title.show(["torchrun", *request.argv], "torchrun")
    env = dict(request.env)
    socket_path = env.get(ZYGOTE_ENV, "")
    if request.module != "agent":
        env.pop(ZYGOTE_ENV, None)  # the user's code never sees it; an agent passes it on to its ranks
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request.cwd)
    os.umask(request.umask)
    sys.path[:] = request.path
    _fresh_state()
    handoff.FORKED = True
    if request.module == "bootstrap":
        warm_imports.forked(socket_path, sys.modules, os.environ)  # what its first step may offer back
    module: Any = sys.modules[__name__]  # a zygote: this module, run as __main__
    if request.module == "bootstrap":
        from . import bootstrap as module
    elif request.module == "agent":
        from . import agent as module
    sys.argv = [module.__file__ or request.module] + list(request.argv)
    module.main(list(request.argv))


def _fresh_state() -> None:
    """Python's ``random`` reseeds itself after a fork; numpy's global generator does not."""
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        try:
            np_random.seed()
        except Exception:
            pass
    tempfile: Any = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile.tempdir = None  # chosen again from this child's TMPDIR (the agent's is the work directory's)
    threads = (os.environ.get("OMP_NUM_THREADS") or "").strip()
    torch = sys.modules.get("torch")
    if torch is None or threads == (_WARMED_THREADS or "").strip():
        return
    if threads.isdigit() and int(threads) > 0:
        count = int(threads)
    elif not threads:  # the zygote was given 1 for many ranks a node; this torchrun runs one
        count = len(os.sched_getaffinity(0))
    else:
        return
    try:
        torch.set_num_threads(count)
    except Exception:
        pass


def main(argv: List[str]) -> None:
    global _FRESH_NAME, _GUARD, _SOCKET
    _GUARD = ForkGuard(inherited=handoff.FORKED)  # the threads alive before anything of ours ran
    os.umask(0o077)  # what it writes is private (docs/seeing-the-gang.md); each child gets its stand-in's
    if len(argv) not in (1, 2) or argv[1:] and argv[1].strip():  # SOCKET [room: blanks, host/title.py]
        sys.stderr.write("usage: python -m %s SOCKET\n" % __name__)
        sys.exit(2)
    title.prepare()  # before anything changes the environment; every child inherits it
    _SOCKET = argv[0]
    if handoff.FORKED:  # forked from another zygote, this socket our stdin
        title.show(_own_command(argv[0]), ZYGOTE_NAME.decode())
        listener = _listener_from_stdin()
        _write_pid(argv[0] + ZYGOTE_PID_SUFFIX, str(os.getpid()))
    else:
        _FRESH_NAME = _own_name()
        if len(argv) == 2:  # the room stays for the children's titles, out of sight
            title.show(_own_command(argv[0]), _FRESH_NAME.decode(errors="replace"))
        listener = listen(argv[0])
        os.dup2(listener.fileno(), 0)
        if os.environ.get(ZYGOTE_ENV) != argv[0]:
            handoff.hand_off("zygote", argv)  # returns where no zygote took it: import here
        _stdin_from_devnull()
        name_this_process(ZYGOTE_NAME)
    warm(os.path.dirname(os.path.abspath(argv[0])))
    _GUARD.warmed()
    request, fds = Server(listener).serve()
    if request.module != "bootstrap":
        become(request, fds)  # an agent ends itself (agent.exit_now); a zygote serves until it is killed
        return
    exit_warm(_rank_ran(request, fds))


def _rank_ran(request: Request, fds: List[int]) -> int:
    """Any other end (an exception, an exit with a message) goes up to Python."""
    try:
        become(request, fds)
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int) and -(1 << 31) <= code < (1 << 31):
            return code
        raise
    return 0


def exit_warm(code: int) -> NoReturn:
    """End a forked rank as Python would, less the teardown of modules and
    libtorch's static destructors (objects shared with the zygote, copied page
    by page only to be freed: 0.15 of a rank's 0.2 CPU-s). A module's objects
    then get no ``__del__``, which Python does not promise at exit."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
    except BaseException:
        pass
    atexit._run_exitfuncs()
    bootstrap = sys.modules.get(__package__ + ".bootstrap") if __package__ else None
    if bootstrap is not None:
        bootstrap.release_main()  # Python's first step at exit: the script's names, in order
    _flush_open_files()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            if stream is sys.stdout and code == 0:
                code = 120  # Python's own status for a stdout it could not flush at exit
    try:
        import ctypes  # the rank-start boundary: a stand-in loads this module

        ctypes.CDLL(None).fflush(None)  # what C and C++ code of the script's libraries buffered
    except Exception:
        pass
    os._exit(code & 0xFF)


def _flush_open_files() -> None:
    """Text layers before their buffers, before the collector may close a buffer
    first (CPython bpo-17852); the zygote's own objects, frozen, stay untouched."""
    import io  # the rank-start boundary: a stand-in loads this module

    made = [obj for generation in range(3) for obj in gc.get_objects(generation)]
    for kind in (io.TextIOBase, io.BufferedIOBase):
        for obj in made:
            if isinstance(obj, kind):
                try:
                    if not obj.closed:
                        obj.flush()
                except Exception:
                    pass


def _own_command(socket_path: str) -> List[str]:
    return [sys.executable, "-u", "-m", __spec__.name if __spec__ else __name__, socket_path]


def _own_name() -> bytes:
    try:
        with open("/proc/self/comm", "rb") as f:
            return f.read().strip()
    except OSError:
        return b"python"


def _stdin_from_devnull() -> None:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def _listener_from_stdin() -> socket.socket:
    try:
        listener = socket.socket(fileno=os.dup(0))
    except OSError as e:
        sys.stderr.write("a forked zygote's stdin must be its listening socket: %s\n" % e)
        sys.exit(2)
    _stdin_from_devnull()
    if listener.family != socket.AF_UNIX or listener.type != socket.SOCK_STREAM:
        sys.stderr.write("a forked zygote's stdin must be a Unix stream socket\n")
        sys.exit(2)
    return listener


def _write_pid(target: str, text: str) -> None:
    """The asking node's supervisor tracks what it forks: the stand-in is not its parent (a
    warmer's, too: warm_imports.WARMER_SUFFIX)."""
    try:
        fd = os.open(target + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
        os.replace(target + ".tmp", target)
    except OSError:
        pass


def _note(what: Dict[str, Any]) -> None:
    """What became of this process's warmer, beside its socket: the node's task tracks a warmer's children
    and says in its debug log what became of it (runtime/warm_start.py)."""
    if _SOCKET:
        import json  # zygote_wire.py imported it

        _write_pid(_SOCKET + warm_imports.WARMER_SUFFIX, json.dumps(what))


if __name__ == "__main__":
    main(sys.argv[1:])
