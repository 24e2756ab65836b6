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
    from typing import Dict, List, Optional, Tuple

# Joined by the forked child in this order, mounts last (joining them resets the root and the working directory).
JOINED = ("net", "uts", "ipc", "mnt")
FIXED = ("pid", "user")  # a difference here is a refusal
_CAP_SYS_CHROOT, _CAP_SYS_ADMIN = 18, 21  # setns(2): both for a mount namespace, the latter for the rest


def _own(kind: str) -> Optional[Tuple[int, int]]:
    try:
        st = os.stat("/proc/self/ns/" + kind)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def to_join(pid: int) -> Tuple[Dict[str, int], Optional[str]]:
    """The namespaces process ``pid`` lives in apart from this one, opened: what a child of
    this process joins (``join``), compared as opened, so that what is joined is what was
    compared. Else why a child could not join them, and nothing open."""
    handles: Dict[str, int] = {}
    unlike: List[str] = []
    try:
        for kind in JOINED + FIXED:
            if _differs(pid, kind, handles):
                unlike.append(kind)
    except OSError:
        close_handles(handles)
        raise
    fixed = [kind for kind in unlike if kind in FIXED]
    why = None
    if fixed:
        why = "another %s namespace" % " and ".join(fixed)
    elif unlike and (len(handles) < len(unlike) or not _may_join(_effective_caps())):
        why = "another %s namespace, which this process may not join" % " and ".join(unlike)
    if why is not None:
        close_handles(handles)
    return handles, why


def _differs(pid: int, kind: str, handles: Dict[str, int]) -> bool:
    """Whether ``pid``'s namespace of ``kind`` is not this process's; where it can be joined,
    its handle is kept in ``handles``."""
    own = _own(kind)
    if own is None:  # no /proc/self/ns here (some sandboxes' kernels): nothing to compare, as before
        return False
    try:
        fd = os.open("/proc/%d/ns/%s" % (pid, kind), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # gone, or a pid this pid namespace does not show (SO_PEERCRED's 0)
        return True
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if (st.st_dev, st.st_ino) == own:
        os.close(fd)
        return False
    handles[kind] = fd
    return True


def _effective_caps() -> int:
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _may_join(caps: int) -> bool:
    return all(caps >> bit & 1 for bit in (_CAP_SYS_ADMIN, _CAP_SYS_CHROOT))


def join(handles: Dict[str, int]) -> None:
    """In a child with one thread (a forked warm process has one); closes the handles.
    Mounts last: joining them resets the root and working directory, which the child
    sets again from its asker's."""
    try:
        for kind in JOINED:
            if kind in handles:
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
    import ctypes  # the rank-start boundary: a stand-in loads this module

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
