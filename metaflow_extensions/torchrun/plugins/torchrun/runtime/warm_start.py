"""The step's warm process on this node (``procs/zygote.py``): started as the step
joins its gang, so ``import torch`` is paid once while the gang forms, not in every
agent, rank and restart (docs/design.md's module map says who forks from whom).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
from typing import Any, Dict, Mapping, Optional, Tuple

from ..host.private import open_private
from ..host.proctree import die_with_parent, kill_group, parent_of
from ..host.workdirs import StepDir
from ..host import title
from ..launch import StepDefaults
from ..launch.command import ZYGOTE_MODULE
from ..procs.names import HOST_ZYGOTE_ENV, ZYGOTE_ENV, ZYGOTE_PID_SUFFIX, ZYGOTE_SOCKET, zygote_log_path
from ..procs.warm_imports import WARMER_SUFFIX

_log = logging.getLogger("metaflow_torchrun")


class WarmStart:
    """The zygote of a step or call on this node; nothing where ``on`` (``Knobs.warm_start``) is false."""

    def __init__(self, workdir: str, log_dir: Optional[str], on: bool = True, owned: Optional[StepDir] = None):
        self.proc: Optional[subprocess.Popen] = None
        self._forked_pid: Optional[int] = None
        self._may_fork = False  # asked the host's to fork it: its pid comes in a file
        self._dir = owned  # removed with the process
        self._warmer_said: Optional[str] = None  # what its warmer's note said last (said once in the debug log)
        self.path = os.path.join(workdir, ZYGOTE_SOCKET) if workdir else ""
        self.log_dir = log_dir
        if not on:  # a path of any length: host/unix_socket.py
            self.path = ""

    @classmethod
    def for_step(cls, on: bool) -> "WarmStart":
        """In a directory of its own, which goes with it."""
        if not on:
            return cls("", None, on)
        try:
            directory = StepDir()
        except OSError as e:
            _log.debug("no warm process: %s", e)
            return cls("", None, on)
        return cls(directory.path, directory.path, on, owned=directory)

    @classmethod
    def started_for_step(cls, defaults: StepDefaults, environ: Mapping[str, str] = os.environ) -> "WarmStart":
        """Started now, importing torch while the step joins its gang."""
        warm = cls.for_step(defaults.knobs.warm_start)
        nproc = defaults.nproc_per_node
        guess = defaults.derived_nproc or (nproc if isinstance(nproc, int) and not isinstance(nproc, bool) else 2)
        warm.start(environ, guess)
        return warm

    @classmethod
    def for_call(cls, step: Optional["WarmStart"], workdir: str, log_dir: Optional[str], on: bool) -> "WarmStart":
        """The step's, while it runs; else one of the call's own, in its work directory."""
        return step if step is not None and step.pid else cls(workdir, log_dir, on)

    @property
    def pid(self) -> Optional[int]:
        """The process that forks this node's agent and ranks, while it runs."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        if self._forked_pid is None and self._may_fork:
            self._forked_pid = _pid_beside(self.path)
        return self._forked_pid or self.proc.pid

    @property
    def pids(self) -> Tuple[int, ...]:
        """The processes that fork this node's agents and ranks: the warm process, and the warmer it
        forked once that serves (what the ranks had loaded imported too, procs/zygote.py). Read as the
        supervisor tracks them; what became of the warmer is said once in the debug log."""
        pid = self.pid
        if pid is None:
            return ()
        warmer = self._warmer(pid)
        return (pid, warmer) if warmer is not None else (pid,)

    def _warmer(self, pid: int) -> Optional[int]:
        try:
            with open(self.path + WARMER_SUFFIX, "rb") as f:
                text = f.read(4096).decode(errors="replace").strip()
            note = json.loads(text)
        except (OSError, ValueError):
            return None
        if not isinstance(note, dict):
            return None
        if text != self._warmer_said:
            self._warmer_said = text
            if "gave_up" in note:
                _log.debug("the warm process's import of what the ranks had loaded: %s; a restart's ranks "
                           "import it themselves", str(note["gave_up"])[:300])
            else:
                _log.debug("the warm process imported what the ranks had loaded by their first step "
                           "(%s modules, %s s): a restart's ranks fork with it", note.get("modules"),
                           note.get("seconds"))
        warmer = note.get("pid")
        return warmer if isinstance(warmer, int) and warmer > 1 and parent_of(warmer) == pid else None

    def share_with_local_nodes(self) -> None:
        """On a local control, before its nodes start: theirs fork from this one."""
        if self.proc is not None and self.path:
            os.environ[HOST_ZYGOTE_ENV] = self.path

    def start(self, env: Mapping[str, str], nproc: int) -> None:
        """Once (restarts fork from the same one); ``OMP_NUM_THREADS=1`` where torchrun would
        set it: libraries read it as they load."""
        if self.proc is not None or not self.path:
            return
        zenv = dict(env)
        host = zenv.pop(HOST_ZYGOTE_ENV, "")
        zenv.pop(ZYGOTE_ENV, None)
        if host and host != self.path:
            zenv[ZYGOTE_ENV] = host  # procs/zygote.py: forked there when it answers
            self._may_fork = True
        if nproc > 1 and "OMP_NUM_THREADS" not in zenv:
            zenv["OMP_NUM_THREADS"] = "1"  # torchrun's own choice for its ranks
        out: Any = subprocess.DEVNULL
        if self.log_dir:
            try:
                out = os.fdopen(open_private(zygote_log_path(self.log_dir)), "ab")  # 0600, as every file of ours
            except OSError:
                pass
        try:
            # Room in its command line for the titles of what it forks (host/title.py).
            command = [sys.executable, "-u", "-m", ZYGOTE_MODULE, self.path, *title.room()]
            self.proc = subprocess.Popen(command, env=zenv,
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=die_with_parent)
            _log.debug("the warm process started: pid %d", self.proc.pid)
        except OSError as e:
            _log.debug("no warm process: %s", e)
            self.path = ""
        finally:
            if out is not subprocess.DEVNULL:
                out.close()

    def for_ranks(self, env: Mapping[str, str], nproc: int) -> Dict[str, str]:
        """torchrun's environment, the warm process started with the call's first start."""
        self.start(env, nproc)
        return self.environment(env)

    def environment(self, env: Mapping[str, str]) -> Dict[str, str]:
        """torchrun's environment, pointing its agent and ranks at the zygote."""
        out = {k: v for k, v in env.items() if k not in (HOST_ZYGOTE_ENV, ZYGOTE_ENV)}
        if self.proc is not None and self.path:
            out[ZYGOTE_ENV] = self.path
        return out

    def close(self) -> None:
        """It holds nothing worth a grace: the ranks it forked are gone by now."""
        if self.proc is not None and self.proc.returncode is None:
            kill_group(self.proc)
            if self.path:
                try:
                    os.unlink(self.path)
                except OSError:
                    pass
        if self._dir is not None:
            self._dir.close()
            self._dir = None


# Metaflow's runtime's own, on a local run: a retry's new tasks find torch imported too.
_RUNTIME: Optional[WarmStart] = None


def share_runtime_warm(env: Dict[str, str], on: bool) -> None:
    """In Metaflow's runtime, as it starts a task on this host: once per run, named in the task's ``env``."""
    global _RUNTIME
    if _RUNTIME is None:
        _RUNTIME = WarmStart.for_step(on)
        _RUNTIME.start(_runtime_env(os.environ), 2)
    if _RUNTIME.pid:
        env[HOST_ZYGOTE_ENV] = _RUNTIME.path


def _runtime_env(environ: Mapping[str, str]) -> Dict[str, str]:
    """A warm process already named where the runtime started (a test worker's, a
    caller's) forks the run's, torch imported once for many runs; a name that is
    not a socket of ours (gone, someone else's) is dropped: no wait for it."""
    env = dict(environ)
    host = env.pop(HOST_ZYGOTE_ENV, "")
    if host and _our_socket(host):
        env[HOST_ZYGOTE_ENV] = host
    return env


def _our_socket(path: str) -> bool:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISSOCK(st.st_mode) and st.st_uid == os.getuid()


def close_runtime_warm() -> None:
    """As Metaflow's runtime finishes the run."""
    global _RUNTIME
    if _RUNTIME is not None:
        _RUNTIME.close()
        _RUNTIME = None


def _pid_beside(socket_path: str) -> Optional[int]:
    """The pid a forked warm process wrote beside its socket; None until it has."""
    try:
        with open(socket_path + ZYGOTE_PID_SUFFIX, "rb") as f:
            pid = int(f.read(32).strip())
    except (OSError, ValueError):
        return None
    return pid if 1 < pid < (1 << 31) else None
