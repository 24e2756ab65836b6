"""A tiny all-reduce job, for the real-nodes benchmark (benchmarks/real_nodes.py).

Every rank joins the gloo group (printing BENCHREADY), all-reduces a one and
prints the sum. Then, by --mode:
- hello: leave;
- raise: rank --rank notes the time (crash.json) and raises after --after
  seconds, the others all-reduce until they are stopped;
- spin: every rank all-reduces until it is stopped (a node is SIGKILLed).
Every rank writes ready-R.json once the sum is printed.
"""

import argparse
import time

import torch
import torch.distributed as dist

from _bench import emit, init, rank, write_json

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=("hello", "raise", "spin"), default="hello")
p.add_argument("--rank", type=int, default=-1)
p.add_argument("--after", type=float, default=1.0)
args = p.parse_args()

init()
t = torch.ones(1)
dist.all_reduce(t)
emit("rank %d: all-reduce sum %d of %d ranks\n" % (rank(), int(t.item()), dist.get_world_size()))
write_json("ready-%d.json" % rank(), {"rank": rank(), "time": time.time()})
if args.mode == "hello":
    dist.destroy_process_group()
    raise SystemExit(0)
if rank() == args.rank:
    time.sleep(args.after)
    write_json("crash.json", {"rank": rank(), "time": time.time()})
    raise RuntimeError("injected failure on rank %d" % rank())
while True:
    dist.all_reduce(t)
    time.sleep(0.05)
