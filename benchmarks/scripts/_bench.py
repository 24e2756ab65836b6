"""Shared by the benchmark scripts: where to write small reports, the gloo group.

Every script runs unchanged under @torchrun (through its bootstrap) and under a
hand-written ``python -m torch.distributed.run``: nothing here depends on which.
"""

import json
import os
import time

import torch.distributed as dist


def rank() -> int:
    return int(os.environ["RANK"])


def init() -> float:
    """Join the gloo group; print the time this rank got there (one write)."""
    dist.init_process_group("gloo")
    now = time.time()
    emit("BENCHREADY rank=%d world=%d t=%.6f\n" % (dist.get_rank(), dist.get_world_size(), now))
    return now


def emit(text: str) -> None:
    """One write per line, as ``logging`` does: lines from ranks sharing a pipe
    never interleave mid-line, whatever buffering the launcher set up."""
    import sys

    sys.stdout.write(text)
    sys.stdout.flush()


def write_json(name: str, data) -> None:
    directory = os.environ.get("BENCH_OUT")
    if not directory:
        return
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)
