"""A tiny DDP training that saves a checkpoint every epoch from rank 0 with
metaflow-checkpoint's Checkpoint, and resumes from --resume-from."""

import argparse
import json
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=6)
p.add_argument("--resume-from", default=None)
p.add_argument("--metrics-out", required=True)
p.add_argument("--die-after-epoch", type=int, default=0)
p.add_argument("--task-pid", type=int, default=0)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
teacher = torch.nn.Linear(16, 1)
model = DDP(torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
start = 1
if args.resume_from:  # current.checkpoint.directory of the step
    state = torch.load(os.path.join(args.resume_from, "state.pt"))
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["epoch"] + 1
print("training from epoch %d" % start, flush=True)
loss = torch.tensor(0.0)
for epoch in range(start, args.epochs + 1):
    for _ in range(20):
        x = torch.randn(64, 16)
        loss = (model(x) - teacher(x).detach()).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if rank == 0:
        from metaflow import Checkpoint  # the step's @checkpoint, inherited by the ranks

        ckpt = Checkpoint(init_dir=True)
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                   os.path.join(ckpt.directory, "state.pt"))
        ckpt.save(metadata={"epoch": epoch, "loss": float(loss)})
        print("epoch %d: loss %.4f, saved" % (epoch, float(loss)), flush=True)
    dist.barrier()
    if epoch == args.die_after_epoch and args.task_pid and int(os.environ["LOCAL_RANK"]) == 0:
        os.kill(args.task_pid, signal.SIGKILL)  # the machine is gone
        time.sleep(60)
if rank == 0:
    with open(args.metrics_out, "w") as f:
        json.dump({"loss": float(loss), "resumed_from": start - 1 if args.resume_from else None}, f)
dist.destroy_process_group()
