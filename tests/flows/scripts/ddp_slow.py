"""DDP on gloo whose steps take --step seconds, one rank (--slow-rank) --slow seconds longer inside its
backward (DDP's all-reduce then waits for it, and every rank's step rate is the same), for --seconds.
Rank 0 writes how many steps were done (done.json)."""

import argparse
import time

import torch
import torch.distributed as dist

from _common import init, rank, write_json

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=30.0)
p.add_argument("--step", type=float, default=0.1)
p.add_argument("--slow", type=float, default=0.0)
p.add_argument("--slow-rank", type=int, default=-1)
args = p.parse_args()

init()
if rank() == 0:
    write_json("started.json", {"at": time.time()})
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
if rank() == args.slow_rank:
    model.module.weight.register_hook(lambda grad: (time.sleep(args.slow), grad)[1])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps, end = 0, time.time() + args.seconds
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
if rank() == 0:
    write_json("done.json", {"steps": steps})
