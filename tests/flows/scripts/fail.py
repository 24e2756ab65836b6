"""The rank given by --rank raises; the others keep doing collectives."""

import argparse
import time

import torch
import torch.distributed as dist

from _common import init, rank

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, default=1)
args = p.parse_args()
init()
dist.barrier()


def explode(r):
    raise ValueError("boom from rank %d" % r)


if rank() == args.rank:
    time.sleep(0.5)
    explode(rank())
t = torch.zeros(1)
while True:
    dist.all_reduce(t)
    time.sleep(0.05)
