"""What an in-memory snapshot costs a training step: ``save`` to return, the background work, the step.

The node's store runs in a process of its own (the task's role); this process is one rank that
trains a model of ``--mb`` MB of state (float32 weights and an SGD momentum buffer of the same
size, in layers of 1024 x 1024: ``--mb 50`` is 6 layers, 6.3M parameters, 48 MB). It reports, as medians over ``--saves`` snapshots:

- **return**: ms from ``save`` called to its return: the state walked, copied into a slot of the
  store's memory (a memfd the rank mapped once) and committed, so the store holds it; on a GPU, the
  device-to-host copy queued;
- **floor**: ms of one plain memcpy of the same bytes into memory already mapped, in this process:
  what no design of ``save`` on this machine goes under;
- **background**: ms from ``save``'s return until the store holds the snapshot whole, measured with
  the training idle: 0 for CPU state (``save`` commits before it returns); on a GPU, the wait for the
  device copy and the copy from pinned memory into the slot;
- **step**: a training step's ms without snapshots and with a snapshot every ``--every`` steps (the
  median of the means of short blocks of each, alternated), and the difference in %, the cost that
  counts; the same in this process's CPU time (all its threads), which other work on a shared machine
  moves far less than the wall time; and the machine's 1-minute load average.

    .venv/bin/python benchmarks/snapshot_cost.py [--mb 50] [--saves 20] [--batch 256] [--every 1] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

STORE = """
import sys
from metaflow_extensions.torchrun.plugins.torchrun.snapshots.node.store import SnapshotStore
store = SnapshotStore(sys.argv[1], budget=int(sys.argv[2]))
print(store.path, flush=True)
sys.stdin.read()
store.close()
"""


def start_store(directory: str, budget: int) -> "tuple[subprocess.Popen, str]":
    proc = subprocess.Popen([sys.executable, "-c", STORE, directory, str(budget)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))))
    assert proc.stdout is not None
    path = proc.stdout.readline().decode().strip()
    if not path:
        raise SystemExit("the snapshot store did not start (exit %s): its error is above" % proc.wait())
    return proc, path


def make_model(mb: float, device: str) -> Any:
    import torch

    width = 1024
    params = int(mb * (1 << 20) / 8)  # weights + momentum, 4 bytes each
    layers = max(1, round(params / (width * width + width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(device)
    return model, torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)


def train_step(model: Any, opt: Any, batch: Any) -> None:
    opt.zero_grad()
    model(batch).pow(2).mean().backward()
    opt.step()


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def memcpy_floor(state: Any, repeats: int) -> float:
    """The median ms of copying every CPU tensor of ``state`` into one buffer already touched, by memmove."""
    import ctypes

    import torch

    tensors = [t for part in state.values() for t in _tensors(part) if t.device.type == "cpu"]
    total = sum(t.numel() * t.element_size() for t in tensors)
    if not tensors:
        return 0.0
    out = torch.ones(total, dtype=torch.uint8)
    times = []
    for _ in range(repeats + 2):
        start, at = time.perf_counter(), out.data_ptr()
        for t in tensors:
            ctypes.memmove(at, t.contiguous().data_ptr(), t.numel() * t.element_size())
            at += t.numel() * t.element_size()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[2:])


def _tensors(value: Any) -> List[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def measure(args: argparse.Namespace) -> Dict[str, Any]:
    import torch

    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import api as snapshot

    model, opt = make_model(args.mb, args.device)
    batch = torch.randn(args.batch, 1024, device=args.device)
    train_step(model, opt, batch)  # the momentum buffers exist from here
    state = lambda: {"model": model.state_dict(), "opt": opt.state_dict()}  # noqa: E731
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 2
    floor = memcpy_floor(state(), args.saves)

    returns: List[float] = []
    background: List[float] = []
    for i in range(args.saves + 2):
        sync(args.device)
        start = time.perf_counter()
        if not snapshot.save(i, state()):
            raise SystemExit("save() kept nothing: the store refused it (above)")
        returned = time.perf_counter()
        assert snapshot.flush(60)
        done = time.perf_counter()
        if i >= 2:  # the first two allocate the buffers
            returns.append((returned - start) * 1e3)
            background.append((done - returned) * 1e3)

    def block(save_every: bool) -> "tuple[float, float]":
        """The mean ms of a few steps, wall and this process's CPU, with a snapshot every ``--every`` or none."""
        times = []
        cpu = time.process_time()
        for i in range(4 * args.every):
            sync(args.device)
            start = time.perf_counter()
            train_step(model, opt, batch)
            if save_every and i % args.every == 0:
                snapshot.save(1000 + i, state())
            sync(args.device)
            times.append((time.perf_counter() - start) * 1e3)
        snapshot.flush(60)
        return statistics.mean(times), (time.process_time() - cpu) * 1e3 / len(times)

    block(False), block(True)  # warm
    plains, savings = [], []
    for _ in range(max(2, args.saves // 2)):  # alternated: a machine's drift falls on both alike
        plains.append(block(False))
        savings.append(block(True))
    plain, saving = statistics.median(p[0] for p in plains), statistics.median(s[0] for s in savings)
    plain_cpu, saving_cpu = statistics.median(p[1] for p in plains), statistics.median(s[1] for s in savings)
    ms_background = statistics.median(background)
    return {"device": args.device, "state_mb": round(nbytes / (1 << 20), 1), "batch": args.batch,
            "save_return_ms": round(statistics.median(returns), 2), "floor_ms": round(floor, 2),
            "background_ms": round(ms_background, 2),
            "every": args.every, "step_ms": round(plain, 2), "step_with_save_ms": round(saving, 2),
            "cost_pct": round(100 * (saving - plain) / plain, 1), "step_cpu_ms": round(plain_cpu, 2),
            "step_with_save_cpu_ms": round(saving_cpu, 2),
            "cpu_cost_pct": round(100 * (saving_cpu - plain_cpu) / plain_cpu, 1), "cores": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=50.0)
    parser.add_argument("--saves", type=int, default=20)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--every", type=int, default=1, help="a snapshot every N steps in the step figure")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from metaflow_extensions.torchrun.plugins.torchrun.procs.names import SNAPSHOT_ENV

    with tempfile.TemporaryDirectory() as tmp:
        store, path = start_store(os.path.join(tmp, "store"), budget=int(args.mb * 6) << 20)
        os.environ[SNAPSHOT_ENV] = path
        try:
            result = measure(args)
        finally:
            assert store.stdin is not None
            store.stdin.close()
            store.wait(timeout=30)
    if args.json:
        print(json.dumps(result))
        return
    for name, value in result.items():
        print("%-22s %s" % (name, value))


if __name__ == "__main__":
    main()
