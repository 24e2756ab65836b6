"""A training loop as the network tests need one: an all-reduce every 0.2 s for
``--steps`` steps. Says it is ready, then at the end writes how many steps it
did and the longest any all-reduce took (a network blip shows there)."""

import argparse
import time

import torch
import torch.distributed as dist

from _common import init, rank, write_json

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--every", type=float, default=0.2)
args = parser.parse_args()

init()
dist.barrier()
write_json("ready-%d.json" % rank(), {"rank": rank()})
t = torch.ones(1)
done, longest, stalls = 0, 0.0, []
for _ in range(args.steps):
    began = time.monotonic()
    dist.all_reduce(t)
    took = time.monotonic() - began
    if took > 1.0:
        stalls.append(round(took, 1))  # seconds one all-reduce took: a blip
    longest = max(longest, took)
    done += 1
    time.sleep(args.every)
write_json("steps-%d.json" % rank(), {"rank": rank(), "steps": done, "longest": round(longest, 2),
                                      "stalls": stalls, "world": dist.get_world_size()})
dist.destroy_process_group()
