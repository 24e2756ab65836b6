"""Rank --rank notes the time and raises; the others do collectives."""

import argparse
import time

import torch
import torch.distributed as dist

from _common import init, rank, write_json

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, default=1)
args = p.parse_args()
init()
dist.barrier()
write_json("ready-%d.json" % rank(), {"rank": rank()})
if rank() == args.rank:
    time.sleep(1.0)
    write_json("crash.json", {"time": time.time()})
    raise RuntimeError("injected crash")
t = torch.zeros(1)
while True:
    dist.all_reduce(t)
    time.sleep(0.05)
