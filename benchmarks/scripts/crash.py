"""Every rank signals readiness, then does collectives forever; rank --rank (if
not -1) notes the time and raises after --after seconds."""

import argparse
import time

import torch
import torch.distributed as dist

from _bench import init, rank, write_json

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, default=-1)
p.add_argument("--after", type=float, default=1.0)
args = p.parse_args()
init()
dist.barrier()
write_json("ready-%d.json" % rank(), {"rank": rank(), "time": time.time()})
if rank() == args.rank:
    time.sleep(args.after)
    write_json("crash.json", {"rank": rank(), "time": time.time()})
    raise RuntimeError("injected crash")
t = torch.zeros(1)
while True:
    dist.all_reduce(t)
    time.sleep(0.05)
