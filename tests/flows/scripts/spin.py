"""Signal readiness, then do collectives forever (until stopped), having said so on a line that has
no newline yet (its last words, if its node is killed)."""

import sys
import time

import torch
import torch.distributed as dist

from _common import init, rank, write_json

init()
dist.barrier()
write_json("ready-%d.json" % rank(), {"rank": rank()})
sys.stdout.write("rank %d: all-reduce under way..." % rank())
sys.stdout.flush()
t = torch.zeros(1)
while True:
    dist.all_reduce(t)
    time.sleep(0.05)
