"""A tiny data-parallel training loop in the shape of Outerbounds'
cifar_distributed example: every epoch, rank 0 saves a checkpoint with
metaflow_checkpoint's ``Checkpoint`` from inside the rank; ``--resume-dir`` (the
step's ``current.checkpoint.directory``) resumes from the last one saved.
Gradients are averaged by ``all_reduce``, as DDP does, and applied by hand, as
SGD does: DDP and ``torch.optim`` import ``torch._dynamo`` (torch 2.13), 1.2 CPU-s
in each of this file's twenty ranks a suite run, and what these tests check is
the checkpoint, not DDP or an optimizer (examples/ddp's tests run both).

Test hooks: ``--kill-after-epoch N --attempt A`` makes node 1 SIGKILL its own
Metaflow task (pid in $MFTR_TEST_OUT/task-pid-1) after epoch N of attempt 0;
``--kill-during-save`` makes rank 0 kill that node's task in the middle of
epoch N's save instead (after the files are written, before they are stored),
and ``--save-seconds S`` makes that save take S seconds more.
Every rank appends what it did to $MFTR_TEST_OUT/epochs.jsonl."""

import argparse
import json
import os
import signal
import time

import torch
import torch.distributed as dist

from _common import init, out_dir, rank

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=4)
p.add_argument("--attempt", type=int, default=0)
p.add_argument("--resume-dir", default=None)
p.add_argument("--kill-after-epoch", type=int, default=-1)
p.add_argument("--kill-node", type=int, default=1)
p.add_argument("--save-seconds", type=float, default=0.0)
p.add_argument("--kill-during-save", action="store_true")
args = p.parse_args()


def note(**what) -> None:
    what.update(rank=rank(), node=int(os.environ["GROUP_RANK"]), attempt=args.attempt, t=time.time(),
                metaflow_node=int(os.environ["MF_PARALLEL_NODE_INDEX"]))
    with open(os.path.join(out_dir(), "epochs.jsonl"), "a") as f:
        f.write(json.dumps(what) + "\n")


def kill_task(node: int, epoch: int) -> None:
    with open(os.path.join(out_dir(), "task-pid-%d" % node)) as f:
        pid = int(f.read())
    note(event="kill", epoch=epoch, pid=pid, target=node)
    os.kill(pid, signal.SIGKILL)


def save(model, epoch: int) -> None:
    from metaflow import Checkpoint  # the task's @checkpoint context, inherited

    checkpoint = Checkpoint(init_dir=True)
    torch.save({"model": model.state_dict(), "epoch": epoch}, os.path.join(checkpoint.directory, "model.pt"))
    if args.kill_during_save and args.attempt == 0 and epoch == args.kill_after_epoch:
        note(event="saving", epoch=epoch)
        kill_task(args.kill_node, epoch)
        time.sleep(args.save_seconds)
    checkpoint.save(metadata={"epoch": epoch})
    note(event="saved", epoch=epoch)


def sgd_step(model, lr: float = 0.01) -> None:
    """The gradients averaged over the ranks, then one step down them."""
    world = dist.get_world_size()
    with torch.no_grad():
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param -= lr * param.grad / world
            param.grad = None


init()
torch.manual_seed(0)  # the same weights on every rank, as DDP's first broadcast makes them
model = torch.nn.Linear(8, 1)
first = 1
if args.resume_dir:
    state = torch.load(os.path.join(args.resume_dir, "model.pt"))
    model.load_state_dict(state["model"])
    first = state["epoch"] + 1
note(event="start", resumed_from=first - 1 if args.resume_dir else None)
print("training from epoch %d" % first, flush=True)
for epoch in range(first, args.epochs + 1):
    for _ in range(4):
        x = torch.randn(16, 8)
        loss = model(x).pow(2).mean()
        loss.backward()
        sgd_step(model)
    note(event="epoch", epoch=epoch)
    if rank() == 0:
        save(model, epoch)
    dist.barrier()
    node = int(os.environ["GROUP_RANK"])
    if args.attempt == 0 and epoch == args.kill_after_epoch and node == args.kill_node \
            and int(os.environ["LOCAL_RANK"]) == 0 and not args.kill_during_save:
        kill_task(node, epoch)
        time.sleep(60)  # the gang stops this rank
dist.destroy_process_group()
