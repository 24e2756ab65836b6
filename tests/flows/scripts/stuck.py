"""Rank 2 blocks in an all-reduce no other rank joins; the others idle quietly."""

import time

import torch
import torch.distributed as dist

from _common import init, rank, write_json

init()
dist.barrier()
write_json("ready-%d.json" % rank(), {"rank": rank()})
if rank() == 2:
    dist.all_reduce(torch.zeros(1))  # stuck: the collective no other rank joins
while True:
    time.sleep(0.1)
