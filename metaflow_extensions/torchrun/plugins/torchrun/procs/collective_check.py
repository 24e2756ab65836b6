"""The collective job of ``@torchrun(preflight="full")``, run on every rank.

Each rank writes the phase it is in, so on an overrun the node can tell ranks
waiting in a collective (an echo) from ones stuck outside one (runtime/preflight.py).
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional

from .bootstrap import WORK_DIR_ENV, NODE_INDEX_ENV

# Test-only: the node whose ranks hang outside any collective once the group is up.
FAKE_HANG_ENV = "METAFLOW_TORCHRUN_FAKE_PREFLIGHT_HANG"
PHASE_FILE = "preflight-local%d.phase"  # by local rank: one work directory per node
WAITING = ("init", "allreduce", "timed", "gather", "exchange")  # a rank here waits on others
SIZE_MIB = 4
ITERATIONS = 5
EXCHANGES = 3


def phase_path(workdir: str, local_rank: int) -> str:
    return os.path.join(workdir, PHASE_FILE % local_rank)


def _phase(name: str) -> None:
    workdir = os.environ.get(WORK_DIR_ENV)
    if not workdir:
        return
    path = phase_path(workdir, int(os.environ.get("LOCAL_RANK", "0")))
    try:
        with open(path + ".tmp", "w") as f:
            f.write(name)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def read_phase(workdir: str, local_rank: int) -> Optional[str]:
    try:
        with open(phase_path(workdir, local_rank)) as f:
            return f.read(32).strip() or None
    except OSError:
        return None


def preflight_job(backend: str, size_mib: int = SIZE_MIB, iterations: int = ITERATIONS) -> Optional[Dict[str, Any]]:
    """A checked all-reduce, a timed one (bus bandwidth as nccl-tests counts
    it), and a ping-pong with each other node in turn; rank 0 returns it all."""
    import torch  # torch only where a rank uses it
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    node = int(os.environ.get(NODE_INDEX_ENV, "0"))
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    _phase("init")
    began = time.perf_counter()
    dist.init_process_group(backend=backend)
    init_s = time.perf_counter() - began
    _phase("ready")
    if os.environ.get(FAKE_HANG_ENV) == str(node):
        while True:
            time.sleep(1)
    world = dist.get_world_size()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    _phase("allreduce")
    check = torch.full((1,), float(rank + 1), dtype=torch.float64, device=device)
    dist.all_reduce(check)
    allreduce_ok = int(check.item()) == world * (world + 1) // 2
    _phase("timed")
    buf = torch.ones(size_mib * (1 << 20) // 4, dtype=torch.float32, device=device)
    dist.all_reduce(buf)  # warm-up: connections and buffers
    sync()
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(buf)
    sync()
    seconds = (time.perf_counter() - start) / iterations
    busbw = buf.numel() * 4 * 2.0 * (world - 1) / world / seconds / 1e9 if world > 1 else 0.0
    _phase("gather")
    mine = torch.tensor([node, local_rank, init_s, busbw], dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    rows = [[float(x) for x in t.tolist()] for t in every]
    _phase("exchange")
    exchanged = _exchange(dist, sync, buf, rank, rows)
    _phase("done")
    dist.destroy_process_group()
    if rank != 0:
        return None
    return _summary(backend, world, allreduce_ok, size_mib, busbw, rows, exchanged)


def _exchange(dist: Any, sync: Any, buf: Any, rank: int, rows: List[List[float]]) -> Dict[int, float]:
    """GB/s each way per node: a warm-up round trip, then ``EXCHANGES`` timed."""
    leaders = {int(r[0]): i for i, r in enumerate(rows) if int(r[1]) == 0}
    home = int(rows[0][0])
    out: Dict[int, float] = {}
    for node in sorted(leaders):
        peer = leaders[node]
        if node == home or rank not in (0, peer):
            continue
        other = peer if rank == 0 else 0
        for i in range(EXCHANGES + 1):
            if i == 1:
                sync()
                start = time.perf_counter()
            if rank == 0:
                dist.send(buf, other)
                dist.recv(buf, other)
            else:
                dist.recv(buf, other)
                dist.send(buf, other)
        sync()
        if rank == 0:
            out[node] = 2.0 * EXCHANGES * buf.numel() * 4 / (time.perf_counter() - start) / 1e9
    return out


def _summary(backend: str, world: int, allreduce_ok: bool, size_mib: int, busbw: float,
             rows: List[List[float]], exchanged: Dict[int, float]) -> Dict[str, Any]:
    init: Dict[int, float] = {}
    for r in rows:
        node = int(r[0])
        init[node] = max(init.get(node, 0.0), round(r[2], 4))
    return {"backend": backend, "world_size": world, "allreduce_ok": allreduce_ok, "size_mib": size_mib,
            "busbw_gbps": round(busbw, 3), "init_s": init,
            "link_gbps": {node: round(v, 3) for node, v in exchanged.items()}, "home_node": int(rows[0][0])}
