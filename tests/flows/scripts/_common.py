"""Helpers for the test scripts: where to write reports, and a gloo group."""

import json
import os

import torch.distributed as dist


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
    dist.init_process_group("gloo")

