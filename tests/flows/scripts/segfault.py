"""The rank given by --rank dies of a segfault; the others do collectives."""

import argparse
import ctypes
import time

import torch
import torch.distributed as dist

from _common import init, rank

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, default=1)
args = p.parse_args()
init()
dist.barrier()
if rank() == args.rank:
    time.sleep(0.5)
    ctypes.string_at(0)  # SIGSEGV
t = torch.zeros(1)
while True:
    dist.all_reduce(t)
    time.sleep(0.05)
