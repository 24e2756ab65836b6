"""What the node's warm process (zygote.py) learns from a rank's first start: the modules from
site-packages the rank had loaded by its first step (transformers, lightning and what they
pull in), imported before a restart so its ranks fork with them in memory, as they do with torch.

The rank's side, ``offer``: local rank 0 of a call's first start, forked from the warm process,
at its first progress report (rank_progress.py's writer thread, off the training path) sends the
names. Which modules is decided by where each one's file is, never by its name: in a
site-packages directory and not under the user's code (the rank's working directory, its
script's directory), the most specific directory deciding (a virtual environment inside the
project is still site-packages). Only the leaves of the module tree are sent (a leaf's import
loads its packages): a package alone is not enough, since transformers loads its submodules
lazily (an HF Trainer's 29 top-level packages imported first left a rank 0.94 s of its 2.4 s
import; its 601 leaves, nothing).

The warm process's side, ``asked`` and ``import_learned``: the names checked again, each module
found again in site-packages before it is imported (a parent before its child), with the user's
directories off ``sys.path`` so that nothing of theirs is imported on the way. It runs in a fork
of the warm process (zygote.py's warmer), which takes over the node's forks only once it is done
and fit to fork: an import that fails is skipped, one that hangs is cut off by the warm process.

Loaded by a rank and by the warm process alone: no ``typing`` at run time (zygote_wire.py).
"""

from __future__ import annotations

import os
import socket
import sys
import time

from ..host.unix_socket import connect_unix
from . import handoff
from .names import ENTRY_ENV, RESTART_COUNT_ENV, USER_TMPDIR_ENV, USER_UMASK_ENV
from .zygote_wire import Request, WireError, send_request

TYPE_CHECKING = False  # typing unimported (zygote_wire.py)
if TYPE_CHECKING:
    from typing import Any, Container, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

MAX_MODULES = 2000  # an HF Trainer's rank sends about 600 leaves
MAX_NAME = 200
# Metaflow and this extension: never loaded in the warm process, wherever they are installed.
NEVER = ("metaflow", "metaflow_extensions")
SECONDS = 60.0  # the most a warmer may take before the warm process gives up on it and forks as before
WARMER_SUFFIX = ".warmer.json"  # beside the warm process's socket: its warmer's pid, or why it gave up on it
_OFFER_SECONDS = 2.0  # the warm process reads an offer as it accepts it


def site_dirs(stdlib: bool = False) -> List[str]:
    """This interpreter's site-packages directories (and its standard library's), each as written and as resolved."""
    found: Set[str] = set()
    try:
        import sysconfig  # only where modules are offered or learned

        paths = sysconfig.get_paths()
        found.update(paths.get(k) or "" for k in ("purelib", "platlib") + (("stdlib", "platstdlib") if stdlib else ()))
    except Exception:
        pass
    try:
        import site  # loaded at every start already

        found.update(site.getsitepackages())
        found.add(site.getusersitepackages())
    except Exception:
        pass
    return _both(found)


def _both(paths: Iterable[str]) -> List[str]:
    out: Set[str] = set()
    for p in paths:
        if p:
            out.add(os.path.abspath(p))
            out.add(os.path.realpath(p))
    return sorted(out)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _deepest(path: str, roots: Sequence[str]) -> int:
    return max((len(r) for r in roots if _under(path, r)), default=-1)


def third_party(path: str, sites: Sequence[str], users: Sequence[str]) -> bool:
    """``path`` is in site-packages and not in the user's code: the most specific directory holding it decides."""
    site = _deepest(path, sites)
    return site >= 0 and site > _deepest(path, users)


def leaves(modules: Mapping[str, Any], sites: Sequence[str], users: Sequence[str],
           known: Container[str] = ()) -> List[str]:
    """The modules from site-packages that no other of them extends, in the order they were loaded, at most
    ``MAX_MODULES``; those ``known`` (the warm process's already) left out."""
    picked = []
    for name, module in modules.items():
        if not isinstance(name, str) or name in known or name.partition(".")[0] in NEVER:
            continue
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and third_party(os.path.abspath(path), sites, users):
            picked.append(name)
    parents = {name.rsplit(".", depth)[0] for name in picked for depth in range(1, name.count(".") + 1)}
    return [name for name in picked if name not in parents][:MAX_MODULES]


def user_dirs(cwd: str, script_dir: str) -> List[str]:
    return _both(d for d in (cwd, script_dir) if d)


# A rank forked from a warm process (zygote.become): that process's socket, its modules, the rank's environment.
_FORKED_FROM = ""
_FORKED_WITH: frozenset = frozenset()
_FORKED_ENV: Mapping[str, str] = {}
# What the bootstrap sets before the script runs (entry.restore_user_tmpdir, bootstrap.main), and torch as its
# compiler stack loads: not the script's changes.
_NOT_THE_SCRIPTS = ("TMPDIR", USER_TMPDIR_ENV, USER_UMASK_ENV, ENTRY_ENV, RESTART_COUNT_ENV, "TORCHINDUCTOR_CACHE_DIR")


def forked(socket_path: str, modules: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    """In a rank the warm process forked, before it runs: where to offer, and what it had then."""
    global _FORKED_FROM, _FORKED_WITH, _FORKED_ENV
    _FORKED_FROM, _FORKED_WITH, _FORKED_ENV = socket_path, frozenset(modules), dict(environ)


def script_changed(now: Mapping[str, str], then: Mapping[str, str]) -> List[str]:
    """The variables the script set or unset since the rank began (ours and torch's aside): a library may
    have read one as it loaded, which the warm process, importing in the task's environment, would not."""
    keys = (set(now) | set(then)) - set(_NOT_THE_SCRIPTS)
    return sorted(k for k in keys if now.get(k) != then.get(k))


def offer(environ: Mapping[str, str] = os.environ) -> bool:
    """From local rank 0 of a first start, forked from the warm process: the modules it has loaded, to
    that warm process. True where they were sent. Not where the script changed its environment first (a
    restart's ranks then import for themselves, as that change asks). Never raises: a rank trains the
    same either way."""
    path = _FORKED_FROM
    if not handoff.FORKED or not path or environ.get("LOCAL_RANK") != "0" or environ.get(RESTART_COUNT_ENV, "0") != "0":
        return False
    if script_changed(environ, _FORKED_ENV):
        return False
    try:
        names = leaves(sys.modules.copy(), site_dirs(), user_dirs(os.getcwd(), sys.path[0] if sys.path else ""),
                       _FORKED_WITH)
        if not names:
            return False
        request = Request(module="imports", argv=names, env={}, cwd=os.getcwd(), path=list(sys.path),
                          stand_in=os.getpid(), executable=sys.executable)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(_OFFER_SECONDS)
            connect_unix(sock, path)
            send_request(sock, request, [])
        return True
    except (OSError, WireError, ValueError):
        return False


def asked(argv: Sequence[str]) -> List[str]:
    """The names of an offer that could be modules (each part an identifier), ours and Metaflow's left out."""
    out = []
    for name in argv[:MAX_MODULES]:
        parts = name.split(".") if len(name) <= MAX_NAME else []
        if parts and all(p.isidentifier() for p in parts) and parts[0] not in NEVER:
            out.append(name)
    return out


def import_learned(names: Sequence[str], users: Sequence[str], deadline: float, sites: Optional[Sequence[str]] = None,
                   system: Optional[Sequence[str]] = None) -> Tuple[int, int]:
    """Imports each module (its packages first), each found in site-packages before it runs; the user's
    directories off ``sys.path`` meanwhile (a working directory of ``/`` keeps the standard library's and
    site-packages'). (imported, skipped); stops at ``deadline`` (monotonic)."""
    import importlib  # only in a warmer
    import importlib.util

    sites = site_dirs() if sites is None else sites
    system = site_dirs(stdlib=True) if system is None else system
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if p and not _users(os.path.abspath(p), system, users)]
    done = skipped = 0
    try:
        for name in names:
            if time.monotonic() > deadline:
                break
            parts = name.split(".")
            try:
                for i in range(1, len(parts) + 1):
                    _import_one(".".join(parts[:i]), sites, users, importlib)
                done += 1
            except BaseException:  # SystemExit too: this process exists for these imports alone
                skipped += 1
    finally:
        sys.path[:] = saved
    return done, skipped


def _users(path: str, system: Sequence[str], users: Sequence[str]) -> bool:
    """``path`` is in the user's code, not in a directory of the interpreter's inside it."""
    return _deepest(path, users) > _deepest(path, system)


class _NotThirdParty(ImportError):
    pass


def _import_one(name: str, sites: Sequence[str], users: Sequence[str], importlib: Any) -> None:
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise _NotThirdParty(name)
    places = [spec.origin] if spec.has_location and spec.origin else list(spec.submodule_search_locations or ())
    if not places or not all(third_party(os.path.abspath(p), sites, users) for p in places):
        raise _NotThirdParty(name)
    importlib.import_module(name)


def cuda_driver_loaded() -> bool:
    """Whether this process has CUDA's driver library mapped: a child forked after it was initialised
    cannot use the GPU."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return b"/libcuda.so" in f.read()
    except OSError:
        return False
