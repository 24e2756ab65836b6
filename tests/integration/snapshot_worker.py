"""One rank of the snapshot tests (test_snapshot_store.py): trains a small model with 2-rank gloo,
saving a snapshot after every step, and logs each step's digest; started again, it loads the
snapshot every rank holds and logs what it loaded. argv: log file, steps, replicated (0/1), pause (s).
"""

import hashlib
import json
import sys
import time

import torch
import torch.distributed as dist

from metaflow_extensions.torchrun.snapshot import flush, load, save


def digest(model, opt):
    h = hashlib.sha256()
    for tensor in list(model.state_dict().values()) + [s["momentum_buffer"] for s in opt.state_dict()["state"].values()]:
        h.update(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main(log_path, steps, replicated, pause):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    log = open(log_path, "a")
    first = 0
    resumed = load(replicated=replicated)
    if resumed is not None:
        first, state = resumed
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        log.write(json.dumps({"loaded": first, "digest": digest(model, opt)}) + "\n")
        log.flush()
    for step in range(first, steps):
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(step * 100 + rank))
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        save(step + 1, {"model": model.state_dict(), "opt": opt.state_dict()}, replicated=replicated)
        log.write(json.dumps({"saved": step + 1, "digest": digest(model, opt)}) + "\n")
        log.flush()
        time.sleep(pause)
    flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4]))
