"""Helpers for the test scripts: where to write reports, and a gloo group."""

import json
import os


def out_dir() -> str:
    path = os.environ["MFTR_TEST_OUT"]
    os.makedirs(path, exist_ok=True)
    return path


def rank() -> int:
    return int(os.environ["RANK"])


def write_json(name: str, data) -> None:
    path = os.path.join(out_dir(), name)
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def init() -> None:
    # torch is imported here, not at the top: the scripts that only print or
    # echo their arguments spare each rank its `import torch` (about 3 CPU-s).
    import torch.distributed as dist

    dist.init_process_group("gloo")

