"""Steady training that reports its progress and resumes from its own checkpoint:
for what the gang says of its pace after a restart and a swap. Every rank takes
--every s a step and all-reduces (its nodes train in lockstep); --kill
"RESTART:RANK:STEP,..." has rank RANK SIGKILL itself after step STEP of start
RESTART, once every rank saved that step; a start that resumes takes --load s
to load its checkpoint before its first step (the time a restart is down). Each start also asks
snapshot.load() first (the flow turns snapshots off: it returns None, and says why once a run)."""

import argparse
import json
import os
import signal
import time

import torch
import torch.distributed as dist

from _common import init, out_dir, rank
from metaflow_extensions.torchrun.progress import report
from metaflow_extensions.torchrun.snapshot import load

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=270)
p.add_argument("--every", type=float, default=0.1)
p.add_argument("--kill", default="", help="RESTART:RANK:STEP,...")
p.add_argument("--load", type=float, default=0.0)
args = p.parse_args()

restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
kills = {(int(r), int(k)): int(s) for r, k, s in (x.split(":") for x in args.kill.split(",") if x)}
dies_after = {s for (r, _), s in kills.items() if r == restart}  # every rank saves these before one dies
init()
assert load() is None  # @torchrun(snapshots=False)
ckpt = os.path.join(out_dir(), "ckpt-rank-%d.json" % rank())
step = 0
if os.path.exists(ckpt):
    with open(ckpt) as f:
        step = json.load(f)["step"]
    time.sleep(args.load)
one = torch.ones(1)
while step < args.steps:
    time.sleep(args.every)
    dist.all_reduce(one)
    step += 1
    with open(ckpt + ".tmp", "w") as f:
        json.dump({"step": step}, f)
    os.replace(ckpt + ".tmp", ckpt)
    report(step, total=args.steps, loss=1.0 / step)
    if step in dies_after:
        dist.barrier()
        if kills.get((restart, rank())) == step:
            os.kill(os.getpid(), signal.SIGKILL)
dist.barrier()
with open(os.path.join(out_dir(), "done-%d.json" % rank()), "w") as f:
    json.dump({"restart": restart, "step": step}, f)
dist.destroy_process_group()
