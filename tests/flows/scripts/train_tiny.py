"""A tiny data-parallel regression on gloo: every rank reports its first and last
loss and a checksum of its weights (equal on every rank while gradients are averaged).
Gradients are averaged by ``all_reduce``, as DDP does, and applied by hand, as SGD
does: DDP and ``torch.optim`` import ``torch._dynamo`` (torch 2.13), 1.1 CPU-s in each
of this file's four ranks, started fresh by the user's own torchrun
(tests/flows/own_torchrun_flow.py); what that test checks is the command built from
``current.torch.torchrun_args`` (examples/ddp's tests run DDP and SGD)."""

import torch
import torch.distributed as dist

from _common import init, rank, write_json


def train() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    for p in model.parameters():  # one model on every rank, as DDP broadcasts rank 0's
        dist.broadcast(p.data, 0)
    world = dist.get_world_size()
    generator = torch.Generator().manual_seed(1 + dist.get_rank())
    x = torch.randn(64, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    losses = []
    for _ in range(30):
        model.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p -= 0.1 * p.grad / world
        losses.append(loss.item())
    write_json("train-%d.json" % rank(), {
        "world": world,
        "first": losses[0],
        "last": losses[-1],
        "weights": round(sum(p.sum().item() for p in model.parameters()), 6),
    })


init()
train()
# Every rank out of its last collective before any tears gloo down: a rank that left
# first and destroyed its group while a peer still read the last all_reduce aborted
# that peer.
dist.barrier()
dist.destroy_process_group()
