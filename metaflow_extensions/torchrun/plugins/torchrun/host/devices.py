"""How many CUDA devices this node's processes will see, without importing torch
(``torch.cuda.device_count()`` took 4.9 to 8.3 s on an H100 node): the driver's
files and ``CUDA_VISIBLE_DEVICES`` as CUDA reads it; where they cannot decide
(MIG, a UUID the files do not show), unknown, and the caller checks nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import List, Mapping, Optional, Sequence

DRIVER_GPUS = "/proc/driver/nvidia/gpus"
_UUID_LINE = re.compile(r"^GPU UUID:\s*(\S+)", re.MULTILINE)


def gpu_uuids(root: str = DRIVER_GPUS) -> Optional[List[str]]:
    """The driver's GPUs' UUIDs (``""`` where a file does not say), in PCI bus order; None without a driver."""
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return None
    uuids = []
    for entry in entries:
        try:
            with open(os.path.join(root, entry, "information"), encoding="utf-8", errors="replace") as f:
                match = _UUID_LINE.search(f.read())
        except OSError:
            match = None
        uuids.append(match.group(1) if match else "")
    return uuids


def visible_count(spec: Optional[str], uuids: Sequence[str]) -> Optional[int]:
    """How many of the driver's ``uuids`` ``CUDA_VISIBLE_DEVICES=spec`` leaves
    visible, as CUDA reads it (indices or ``GPU-`` UUID prefixes, up to the
    first invalid entry; ``""`` hides all); None where that cannot be decided."""
    if spec is None:
        return len(uuids)
    seen = set()
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            break
        if entry.startswith("MIG-"):
            return None  # MIG instances are not listed in the driver's files
        index = _resolve(entry, uuids)
        if index is None:
            if entry.startswith("GPU-") and not all(uuids):
                return None  # a UUID we could not read might have matched
            break
        if index in seen:
            # Measured on an H100: torch counted "0,0" as 0 devices but
            # "0,GPU-<uuid of 0>" as 1. No rule fits both: do not guess.
            return None
        seen.add(index)
    return len(seen)


def _resolve(entry: str, uuids: Sequence[str]) -> Optional[int]:
    if entry.startswith("GPU-"):
        matches = [i for i, u in enumerate(uuids) if u and u.startswith(entry)]
        return matches[0] if len(matches) == 1 else None
    try:
        index = int(entry)
    except ValueError:
        return None
    return index if 0 <= index < len(uuids) else None


def cuda_devices(env: Mapping[str, str] = os.environ, root: str = DRIVER_GPUS) -> Optional[int]:
    """Visible CUDA devices on this node: 0 with no NVIDIA driver, None when the
    driver's files cannot say (the caller then checks nothing)."""
    uuids = gpu_uuids(root)
    if uuids is None:
        return 0
    return visible_count(env.get("CUDA_VISIBLE_DEVICES"), uuids)


def usable_cpus() -> int:
    """The CPUs this task may run on (its affinity: a cpuset, a ``taskset``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def count_with_torch(kind: str, python: str, timeout: float = 180.0) -> Optional[int]:
    """``torch.<kind>.device_count()`` in a child process (torch's import never in the task's),
    where the driver's files cannot say (MIG, XPUs); None when torch could not be asked."""
    code = (
        "import torch\n"
        "m = getattr(torch, %r, None)\n"
        "print(m.device_count() if m is not None and m.is_available() else 0)\n" % kind
    )
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        return int(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None
