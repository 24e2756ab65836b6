"""A small MLP sharded with FSDP2 (`fully_shard`), trained with Adam, its state kept in memory every step.

`load(replicated=False)` gives back what `save` was given: DTensors, each rank's own shard, ready for
`load_state_dict`. Each rank's batch is drawn from a seed of its step and rank, so a run that restarted
ends with the state of one that did not, bit for bit (compare `state_sha256`). Runs as it is under plain
torchrun too: there `save` keeps nothing and `load` returns None."""

import argparse
import hashlib
import json
import os
import signal

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from metaflow_extensions.torchrun.snapshot import load, save

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--width", type=int, default=256)
p.add_argument("--kill-at-step", type=int, default=0, help="rank 3 dies after this step, in the first start")
p.add_argument("--metrics-out", default=None, help="rank 0 writes the final metrics here")
args = p.parse_args()

use_cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if use_cuda else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if use_cuda else torch.device("cpu")
if use_cuda:
    torch.cuda.set_device(device)

torch.manual_seed(0)  # the same initial weights on every rank: each keeps its shard of them
model = torch.nn.Sequential(torch.nn.Linear(32, args.width), torch.nn.ReLU(),
                            torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                            torch.nn.Linear(args.width, 1)).to(device)
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

start = 0
resumed = load(replicated=False)  # after a restart: (step, state) that every rank holds
if resumed is not None:
    start, state = resumed
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
print("rank %d trains from step %d" % (rank, start), flush=True)

teacher = torch.Generator().manual_seed(1)
w_true = torch.randn(32, 1, generator=teacher).to(device)
loss = torch.tensor(0.0)
for step in range(start, args.steps):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(64, 32, generator=g).to(device)
    loss = torch.nn.functional.mse_loss(model(x), torch.tanh(x @ w_true))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    save(step + 1, {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, replicated=False)
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    if step + 1 == args.kill_at_step and not restarted:
        dist.barrier()  # every rank has saved this step before one dies
        if rank == 3:
            os.kill(os.getpid(), signal.SIGKILL)  # a stand-in for a lost GPU


def whole(value):
    return value.full_tensor() if isinstance(value, DTensor) else value


# The whole state's digest (every rank gathers each tensor: full_tensor is collective).
digest = hashlib.sha256()
for tensor in model.state_dict().values():
    digest.update(whole(tensor).cpu().numpy().tobytes())
for param_state in optimizer.state_dict()["state"].values():
    for name in sorted(param_state):
        digest.update(whole(param_state[name]).cpu().numpy().tobytes())
loss = loss.detach()
dist.all_reduce(loss)
if rank == 0:
    print("trained %d steps on %d processes: loss %.4f" % (args.steps, world, loss.item() / world), flush=True)
    if args.metrics_out:
        with open(args.metrics_out, "w") as f:
            json.dump({"resumed_from": start, "loss": loss.item() / world, "state_sha256": digest.hexdigest(),
                       "world_size": world}, f)
dist.barrier()
dist.destroy_process_group()
