"""Every rank prints a short line and a 5,000-character one; rank --rank then
raises with a 5,000-character message while the others wait in a collective."""

import argparse

import torch
import torch.distributed as dist

from _common import init, rank

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, default=1)
args = p.parse_args()
init()
print("short line from rank %d" % rank(), flush=True)
print("L" * 5000, flush=True)
dist.barrier()
if rank() == args.rank:
    raise ValueError("M" * 5000)
dist.all_reduce(torch.zeros(1))
