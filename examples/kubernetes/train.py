"""A small real DDP training: a 2-layer MLP learns a fixed random teacher on
synthetic data. Runs on CPU (gloo) or GPU (nccl), converges in seconds."""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--metrics-out", default=None,
                   help="local rank 0 of each node writes the final metrics here")
    return p.parse_args()


def make_data(samples: int):
    g = torch.Generator().manual_seed(0)  # identical data on every rank
    x = torch.randn(samples, 16, generator=g)
    teacher = torch.randn(16, 1, generator=g)
    y = torch.tanh(x @ teacher) + 0.01 * torch.randn(samples, 1, generator=g)
    return x, y


def main() -> None:
    args = parse_args()
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(1234)  # same initial weights everywhere (DDP also broadcasts)
    model = DDP(
        nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)).to(device),
        device_ids=[local_rank] if use_cuda else None,
    )
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    x, y = make_data(args.samples)
    shard_x, shard_y = x[rank::world].to(device), y[rank::world].to(device)

    def global_loss() -> float:
        with torch.no_grad():
            loss = nn.functional.mse_loss(model(shard_x), shard_y).detach()
        dist.all_reduce(loss)
        return loss.item() / world

    first = global_loss()
    for epoch in range(args.epochs):
        perm = torch.randperm(len(shard_x), generator=torch.Generator().manual_seed(epoch))
        for i in range(0, len(shard_x), args.batch_size):
            idx = perm[i : i + args.batch_size]
            opt.zero_grad()
            nn.functional.mse_loss(model(shard_x[idx]), shard_y[idx]).backward()
            opt.step()
        loss = global_loss()
        if rank == 0 and (epoch % 10 == 0 or epoch == args.epochs - 1):
            print("epoch %3d  loss %.5f" % (epoch, loss), flush=True)

    if local_rank == 0 and args.metrics_out:
        with open(args.metrics_out, "w") as f:
            json.dump({"initial_loss": first, "final_loss": loss, "world_size": world}, f)
    if rank == 0:
        print("trained on %d processes: loss %.4f -> %.4f" % (world, first, loss), flush=True)
    # Every rank done with every collective before any closes its connections:
    # gloo aborts a rank whose peer hangs up while it is still finishing one.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
