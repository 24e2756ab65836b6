"""DDP on gloo whose steps take --step seconds, one rank (--slow-rank) or every rank on one Metaflow node
(--slow-node) --slow seconds longer inside its backward (DDP's all-reduce then waits for it, and every
rank's step rate is the same), for --seconds, or until the wall time --until whatever the start. Rank 0
writes how many steps were done (done.json), and each start's steps and seconds so far, every 10 steps
(pace-<restart>.json)."""

import argparse
import os
import time

import torch
import torch.distributed as dist

from _common import init, rank, write_json

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=30.0)
p.add_argument("--until", type=float, default=0.0, help="a wall time every start ends at (instead of --seconds)")
p.add_argument("--step", type=float, default=0.1)
p.add_argument("--slow", type=float, default=0.0)
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--slow-node", type=int, default=-1, help="every rank started on this Metaflow node is slow")
args = p.parse_args()

init()
if rank() == 0:
    write_json("started.json", {"at": time.time()})
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
node = int(os.environ.get("METAFLOW_TORCHRUN_NODE_INDEX", "-1"))
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
if rank() == args.slow_rank or node == args.slow_node:
    model.module.weight.register_hook(lambda grad: (time.sleep(args.slow), grad)[1])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps, began, end = 0, time.time(), args.until or time.time() + args.seconds
done = torch.zeros(1)
while True:
    done.fill_(1.0 if time.time() >= end else 0.0)
    dist.all_reduce(done)  # every rank stops at the same step
    if done.item() > 0:
        break
    time.sleep(args.step)  # the step's work
    opt.zero_grad()
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
    steps += 1
    if rank() == 0 and steps % 10 == 0:  # a start stopped by a swap leaves its pace too
        write_json("pace-%d.json" % restart, {"steps": steps, "seconds": time.time() - began})
if rank() == 0:
    write_json("done.json", {"steps": steps})
    write_json("pace-%d.json" % restart, {"steps": steps, "seconds": time.time() - began})
