"""Signal readiness, then do collectives forever (until stopped)."""

import time

import torch
import torch.distributed as dist

from _common import init, rank, write_json

init()
dist.barrier()
write_json("ready-%d.json" % rank(), {"rank": rank()})
t = torch.zeros(1)
while True:
    dist.all_reduce(t)
    time.sleep(0.05)
