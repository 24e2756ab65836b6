"""A DDP loop where rank 1 raises after loss.backward() (issue 36's script case)."""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
p.add_argument("--api-token", default="")
args = p.parse_args()


def main():
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(args.steps):
        loss = model(torch.randn(8, 4)).sum()
        loss.backward()
        if dist.get_rank() == 1 and i == 2:
            raise ValueError("rank 1 saw a NaN")
        opt.step()
    dist.destroy_process_group()


main()
