"""Where a process lives: its Linux namespaces, compared and joined.

A warm process forks for whoever reaches its socket, and a path can be reached from
another network namespace (a node of the suite's simulated hosts, a task entered with
``ip netns exec``): a child forked there would live in the warm process's network, host
name and mounts, not the asker's, and its ranks would bind and connect in the wrong
network. So the child joins the asker's namespaces first where it may (root), and the
warm process refuses where it may not, or where the difference cannot be joined by the
child itself (a process's own pid and user namespace are fixed for its life): the asker
then imports torch itself, as it would with no warm process at all.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing unimported: a stand-in loads the warm process's modules (procs/handoff.py)
if TYPE_CHECKING:
    from typing import Dict, Optional, Tuple

# Joined by the forked child, mounts last: the others' handles are open before /proc may change.
JOINED = ("net", "uts", "ipc", "mnt")
FIXED = ("pid", "user")  # a difference here is a refusal
_CAP_SYS_CHROOT, _CAP_SYS_ADMIN = 18, 21  # setns(2): both for a mount namespace, the latter for the rest


def _identity(pid: int, kind: str) -> Optional[Tuple[int, int]]:
    try:
        st = os.stat("/proc/%d/ns/%s" % (pid, kind))
    except OSError:
        return None
    return st.st_dev, st.st_ino


def differences(pid: int, own: int = 0) -> Tuple[Tuple[str, ...], Optional[str]]:
    """The namespaces process ``pid`` lives in apart from ``own`` (this process), and why
    a child of ``own`` could not join them (None: it can)."""
    own = own or os.getpid()
    unlike = tuple(kind for kind in JOINED + FIXED if _identity(pid, kind) != _identity(own, kind))
    fixed = [kind for kind in unlike if kind in FIXED]
    if fixed:
        return unlike, "another %s namespace" % " and ".join(fixed)
    if unlike and not _may_join(_effective_caps(own)):
        return unlike, "another %s namespace, which this process may not join" % " and ".join(unlike)
    return unlike, None


def _effective_caps(pid: int) -> int:
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            for line in f:
                if line.startswith(b"CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _may_join(caps: int) -> bool:
    return all(caps >> bit & 1 for bit in (_CAP_SYS_ADMIN, _CAP_SYS_CHROOT))


def open_handles(pid: int, kinds: Tuple[str, ...]) -> Dict[str, int]:
    """Taken while ``pid`` is known alive (it waits on our answer): its pid cannot be another's yet."""
    handles: Dict[str, int] = {}
    try:
        for kind in kinds:
            handles[kind] = os.open("/proc/%d/ns/%s" % (pid, kind), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        close_handles(handles)
        raise
    return handles


def join(handles: Dict[str, int]) -> None:
    """In a child with one thread (a forked warm process has one); closes the handles.
    Mounts last: joining them resets the root and working directory, which the child
    sets again from its asker's."""
    try:
        for kind in sorted(handles, key=lambda k: JOINED.index(k) if k in JOINED else len(JOINED)):
            _setns(handles[kind])
    finally:
        close_handles(handles)


def close_handles(handles: Dict[str, int]) -> None:
    for fd in handles.values():
        try:
            os.close(fd)
        except OSError:
            pass
    handles.clear()


def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)  # Python 3.12
    if setns is not None:
        setns(fd, 0)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
