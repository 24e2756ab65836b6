"""Find and kill a process tree, children that left its process group included.

torchrun starts every worker in a new session, out of the agent's group and, once
the agent dies, out of its tree: the caller keeps every descendant seen (pid and
start time, so a recycled pid is never killed) and kills from that record.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import time

TYPE_CHECKING = False  # neither typing nor subprocess imported: a rank's stand-in loads this (procs/handoff.py)
if TYPE_CHECKING:
    import subprocess
    from typing import Dict, Iterable, List, Optional, Set, Tuple

    ProcId = Tuple[int, int]  # (pid, start time in clock ticks since boot)

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def _stat(pid: int) -> Optional[Tuple[int, int, bytes]]:
    """(parent pid, start time, name) of a live process, None if it is gone. A supervisor
    reads every process's while its ranks start: one read, the fields up to the start time
    split (0.6 ms a scan of 100 processes, not 1.1)."""
    try:
        fd = os.open("/proc/%d/stat" % pid, os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)  # a name is at most 16 bytes: the line is well under 1 KB
    except OSError:
        return None
    finally:
        os.close(fd)
    # The command name is in parentheses and may itself contain spaces or ')'.
    end = data.rfind(b")")
    rest = data[end + 2 :].split(None, 20)
    if len(rest) < 20 or rest[0] == b"Z":  # a zombie is already dead; it only waits to be reaped
        return None
    return int(rest[1]), int(rest[19]), data[data.find(b"(") + 1 : end]


def _pids() -> List[int]:
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


def parent_of(pid: int) -> Optional[int]:
    """Its parent's pid; None once it is gone."""
    st = _stat(pid)
    return st[0] if st else None


def process_id(pid: int) -> Optional[ProcId]:
    st = _stat(pid)
    return (pid, st[1]) if st else None


def descendants(root: int, *more: int, not_below: Optional[bytes] = None) -> Set[ProcId]:
    """Every live process below ``root`` and ``more`` (not the roots), in one scan of ``/proc``;
    one named ``not_below`` is left out with its tree (another node's warm process, forked from ours)."""
    children: Dict[int, list] = {}
    for pid in _pids():
        st = _stat(pid)
        if st is not None and (not_below is None or st[2] != not_below):
            children.setdefault(st[0], []).append((pid, st[1]))
    found: Set[ProcId] = set()
    stack = [root, *more]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child[0])
    return found


def started_at(pid: int) -> Optional[float]:
    """When ``pid`` started, in epoch seconds (to the second, as the boot time); None if it is gone."""
    st = _stat(pid)
    if st is None:
        return None
    try:
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return boot + st[1] / os.sysconf("SC_CLK_TCK")


def children(parent: int) -> List[Tuple[ProcId, List[str]]]:
    """Direct children of ``parent`` with their command lines."""
    found = []
    for name in _pids():
        st = _stat(name)
        if st is None or st[0] != parent:
            continue
        try:
            with open("/proc/%d/cmdline" % name, "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        found.append(((name, st[1]), argv))
    return found


def alive(procs: Iterable[ProcId]) -> Set[ProcId]:
    return {p for p in procs if process_id(p[0]) == p}


def signal_all(procs: Iterable[ProcId], sig: int) -> None:
    """Signal each process and, when it leads its own group, that whole group."""
    for pid, start in procs:
        if process_id(pid) != (pid, start):
            continue
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except OSError as e:
            if e.errno not in (errno.ESRCH, errno.EPERM):
                raise


def wait_gone(procs: Iterable[ProcId], timeout: float) -> Set[ProcId]:
    """Those of ``procs`` still alive after up to ``timeout``."""
    left = alive(procs)
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = alive(left)
    return left


try:
    _libc: Optional[ctypes.CDLL] = ctypes.CDLL(None, use_errno=True)
except OSError:
    _libc = None
_prctl = getattr(_libc, "prctl", None)
_tgkill = getattr(_libc, "tgkill", None)  # glibc 2.30 and later


def signal_main_thread(pid: int, sig: int) -> None:
    """``sig`` to the main thread of ``pid``, raising as ``os.kill`` does: faulthandler dumps
    the thread that takes a signal (procs/stacks.py), and a torch thread has no Python stack."""
    if _tgkill is not None:
        if _tgkill(int(pid), int(pid), int(sig)) == 0:
            return
        err = ctypes.get_errno()
        if err in (errno.ESRCH, errno.EPERM):
            raise OSError(err, os.strerror(err))
    os.kill(pid, sig)


def kill_group(proc: "subprocess.Popen", timeout: float = 5.0) -> None:
    """SIGKILL the process group ``proc`` leads and reap it, waiting at most ``timeout``."""
    import subprocess  # the rank-start boundary: a stand-in loads this module

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass


def _set(option: int, value: object) -> bool:
    try:
        return _prctl is not None and _prctl(option, value, 0, 0, 0) == 0
    except Exception:
        return False


def name_this_process(name: bytes) -> bool:
    """What ``ps`` and ``/proc/PID/comm`` show for this process (15 bytes at most)."""
    return _set(_PR_SET_NAME, ctypes.c_char_p(name[:15]))


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """``sig`` to this process when its parent dies: the clean-up left when the task is SIGKILLed."""
    return _set(_PR_SET_PDEATHSIG, int(sig))
