"""A tiny DDP regression on gloo: every rank reports its first and last loss and
a checksum of its weights (DDP keeps them equal)."""

import gc

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from _common import init, rank, write_json


def train() -> None:
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1 + dist.get_rank())
    x = torch.randn(64, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    write_json("train-%d.json" % rank(), {
        "world": dist.get_world_size(),
        "first": losses[0],
        "last": losses[-1],
        "weights": round(sum(p.sum().item() for p in model.parameters()), 6),
    })


init()
train()
# Every rank out of its last collective before any tears gloo down: a rank that left
# first and destroyed its group while a peer still read the last all_reduce aborted
# that peer. And the model gone before the group: DDP holds the group, so a model
# left at module level kept gloo's threads to the interpreter's finalization, where
# one that still dropped a tensor asked for the GIL and was ended mid-C++ ('terminate
# called without an active exception', SIGABRT, under torch's own torchrun).
dist.barrier()
gc.collect()
dist.destroy_process_group()
