"""How busy this node's visible GPUs are: the straggler signal of a job whose ranks
report no progress (a node held up by its input leaves its GPUs idle while the others'
spin in collectives). nvidia-smi is on every NVIDIA node but can hang when a GPU has
fallen off the bus, so a daemon thread asks it under a timeout.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from typing import List, Mapping, Optional, Sequence, Tuple

from ..base import timeouts

TOOL = "nvidia-smi"
QUERY = ["--query-gpu=index,uuid,utilization.gpu", "--format=csv,noheader,nounits"]
MAX_GPUS = 1024  # lines read of one answer


def parse_query(text: str) -> List[Tuple[int, str, float]]:
    """``(index, uuid, percent)`` per GPU of nvidia-smi's CSV answer; lines it cannot read left out."""
    out = []
    for line in text.splitlines()[:MAX_GPUS]:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        try:
            percent = float(parts[2])
        except ValueError:
            continue
        if 0.0 <= percent <= 100.0:
            out.append((int(parts[0]), parts[1], percent))
    return out


def visible(gpus: Sequence[Tuple[int, str, float]], spec: Optional[str]) -> List[float]:
    """The utilisation of the GPUs ``CUDA_VISIBLE_DEVICES`` names, as CUDA reads it."""
    if spec is None:
        return [p for _, _, p in gpus]
    by_index = {i: p for i, _, p in gpus}
    out = []
    for entry in (e.strip() for e in spec.split(",")):
        if entry.isdigit() and int(entry) in by_index:
            out.append(by_index[int(entry)])
            continue
        match = [p for _, uuid, p in gpus if entry and uuid.startswith(entry)]
        if len(match) != 1:  # CUDA stops at the first entry it cannot resolve
            break
        out.append(match[0])
    return out


def mean_percent(text: str, spec: Optional[str]) -> Optional[float]:
    """The mean utilisation of the visible GPUs, None when none is known."""
    values = visible(parse_query(text), spec)
    return round(sum(values) / len(values), 1) if values else None


class GpuUsage:
    """Asks nvidia-smi in a daemon thread (none without it); ``latest``: its answer, while fresh."""

    def __init__(self, env: Mapping[str, str], every: float = timeouts.PROGRESS_SEND,
                 tool: Optional[str] = None) -> None:
        self.spec = env.get("CUDA_VISIBLE_DEVICES")
        self.every = every
        self.tool = tool if tool is not None else shutil.which(TOOL)
        self._latest: Optional[Tuple[float, float]] = None  # (monotonic time, percent)
        self._stop = threading.Event()

    def __enter__(self) -> "GpuUsage":
        if self.tool:
            threading.Thread(target=self._loop, name="torchrun-gpu-usage", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def latest(self) -> Optional[float]:
        seen = self._latest
        return seen[1] if seen is not None and time.monotonic() - seen[0] <= 3 * self.every else None

    def ask(self) -> Optional[float]:
        assert self.tool
        try:
            done = subprocess.run([self.tool, *QUERY], capture_output=True, text=True, errors="replace",
                                  timeout=timeouts.GPU_QUERY_TIMEOUT, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return mean_percent(done.stdout, self.spec) if done.returncode == 0 else None

    def _loop(self) -> None:
        while not self._stop.is_set():
            percent = self.ask()
            if percent is not None:
                self._latest = (time.monotonic(), percent)
            if self._stop.wait(self.every):
                return
