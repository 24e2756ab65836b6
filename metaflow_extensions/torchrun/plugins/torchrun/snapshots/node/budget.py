"""How much memory a node's snapshots may take: the smallest of what the host and its container allow.

``/proc/meminfo``'s ``MemAvailable`` is the host's: in a pod with a memory limit, or an AWS Batch job, the
container's cgroup runs out long before it, and the kernel's answer is an OOM kill, not the clear refusal at
the first save. So the room is the smaller of the host's available memory and, for every cgroup from this
process's own up to the root that has a limit, that limit less what the cgroup uses (its working set: its
usage less its inactive page cache, which the kernel reclaims before it kills, as the kubelet counts it).
Both cgroup versions: v2 (``memory.max``, ``memory.current``) and v1 (``memory.limit_in_bytes``,
``memory.usage_in_bytes``).

``/dev/shm``'s size is not counted: a slot is a memfd (``snapshots/rank/memory.py``), which lives in the
kernel's internal tmpfs, not in ``/dev/shm``; its pages count against the memory cgroup of the process that
touches them, which is what the cgroup's limit covers (measured: a 256 MB memfd written with ``/dev/shm``
mounted at 16 MB; the same 128 MB memfd OOM-killed in a cgroup limited to 64 MB). A container's default
``/dev/shm`` of 64 MB would otherwise refuse every snapshot for nothing.

Pure: everything is read under ``root`` (a test passes a fake tree).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

from .shelf import megabytes

FALLBACK = 4 << 30  # where no figure can be read at all (then a quarter of it: 1 GiB, as before)
NO_LIMIT = 1 << 60  # v1 writes "no limit" as a page-rounded 2^63 - 1


@dataclass(frozen=True)
class Budget:
    """The node's snapshot budget in bytes, and where it came from (said with a refusal)."""

    bytes: int
    source: str


def share_of(share: float, root: str = "/") -> Budget:
    """``share`` of the room there is now (``room``): the default budget, or ``snapshot_memory="N%"``."""
    found = room(root)
    return Budget(int(found.bytes * share), "%g%% of %s" % (round(share * 100, 2), found.source))


@dataclass(frozen=True)
class Room:
    """Memory the node's snapshots could take now, and where that figure came from (for a person)."""

    bytes: int
    source: str


def room(root: str = "/") -> Room:
    """The smallest of the host's available memory and every memory cgroup limit's headroom above us."""
    found = [r for r in (_meminfo(root), _cgroup(root)) if r is not None]
    if not found:
        return Room(FALLBACK, "an assumed 4 GB (no memory figure could be read here)")
    return min(found, key=lambda r: r.bytes)


def _meminfo(root: str) -> Optional[Room]:
    text = _read(os.path.join(root, "proc/meminfo"))
    for line in (text or "").splitlines():
        if line.startswith("MemAvailable:"):
            try:
                return Room(int(line.split()[1]) * 1024, "the host's available memory (/proc/meminfo)")
            except (ValueError, IndexError):
                return None
    return None


def _cgroup(root: str) -> Optional[Room]:
    """The tightest headroom of this process's memory cgroup and its ancestors; None: no limit anywhere."""
    v2, v1 = _own_paths(_read(os.path.join(root, "proc/self/cgroup")) or "")
    best: Optional[Room] = None
    for mount, path, files, version in ((os.path.join(root, "sys/fs/cgroup"), v2, _V2, "v2"),
                                        (os.path.join(root, "sys/fs/cgroup/memory"), v1, _V1, "v1")):
        if path is None:
            continue
        for directory in _ancestors(mount, path):
            found = _headroom(directory, files, version)
            if found is not None and (best is None or found.bytes < best.bytes):
                best = found
    return best


_V2 = ("memory.max", "memory.current", "inactive_file")
_V1 = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")


def _own_paths(text: str) -> Tuple[Optional[str], Optional[str]]:
    """(the v2 path, the v1 memory controller's path) of /proc/self/cgroup's lines ``id:controllers:path``."""
    v2 = v1 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _ancestors(mount: str, path: str) -> List[str]:
    """The cgroup's directory and its parents' under ``mount``. Where the container sees only its own cgroup
    at the mount (no cgroup namespace, v1's usual way in Docker) the path is not there: the mount is it."""
    parts = [p for p in path.split("/") if p and p != ".."]
    dirs = [os.path.join(mount, *parts[:n]) for n in range(len(parts), -1, -1)]
    return [d for d in dirs if os.path.isdir(d)]


def _headroom(directory: str, files: Tuple[str, str, str], version: str) -> Optional[Room]:
    limit_text, usage_text = _read(os.path.join(directory, files[0])), _read(os.path.join(directory, files[1]))
    try:
        if limit_text is None or limit_text.strip() == "max" or int(limit_text) >= NO_LIMIT:
            return None
        limit, usage = int(limit_text), int(usage_text or 0)
    except ValueError:
        return None
    inactive = _stat(_read(os.path.join(directory, "memory.stat")) or "", files[2])
    used = max(0, usage - inactive)
    return Room(max(0, limit - used), "the room under the container's memory limit (cgroup %s: %s of %s in use)"
                % (version, megabytes(used), megabytes(limit)))


def _stat(text: str, name: str) -> int:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return 0


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None
