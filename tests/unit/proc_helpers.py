"""Helpers for the unit tests that start real processes (see conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Callable, List, Optional, Tuple

PY = sys.executable

# A grandchild that records its pid (atomically) and then sleeps.
SLEEPER_WRITING_PID = textwrap.dedent(
    """
    import os, sys, time
    path = sys.argv[1]
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    time.sleep(60)
    """
)


def proc_state(pid: int) -> Optional[str]:
    """The one-letter state from /proc/<pid>/stat, None when the pid is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].split()[0].decode()


def start_time(pid: int) -> Optional[int]:
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rfind(b")") + 2 :].split()[19])


def is_running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may never be reaped here)."""
    return proc_state(pid) not in (None, "Z", "X")


def wait_until(pred: Callable[[], bool], timeout: float = 5.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def read_pid_file(path: str, timeout: float = 10.0) -> int:
    assert wait_until(lambda: os.path.exists(path), timeout), "no pid file %s" % path
    with open(path) as f:
        return int(f.read().split()[0])


class Procs:
    def __init__(self) -> None:
        self._pids: List[Tuple[int, Optional[int]]] = []
        self._popens: List[subprocess.Popen] = []

    def add(self, pid: int) -> int:
        self._pids.append((pid, start_time(pid)))
        return pid

    def popen(self, argv, **kwargs) -> subprocess.Popen:
        p = subprocess.Popen(argv, **kwargs)
        self._popens.append(p)
        self.add(p.pid)
        return p

    def cleanup(self) -> None:
        for pid, start in self._pids:
            if start is not None and start_time(pid) == start and is_running(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        for p in self._popens:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
