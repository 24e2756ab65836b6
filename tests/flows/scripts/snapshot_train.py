"""Data-parallel training that keeps its state with ``metaflow_extensions.torchrun.snapshot``: a snapshot every
step (--every), resumed with ``load()`` at every start. Deterministic on CPU (each rank's batch from a
seed of its step and rank, gloo's all-reduce of each gradient in the same order at every start; DDP's
buckets are laid out again after a start's first step, which moves each element's place in gloo's ring
and so its rounding: a resumed DDP run differs from an unbroken one in the last bits), so a run with failures ends with the weights of one
without, bit for bit, when every restart resumes at a step the gang completed.

Failures: --kill-rank SIGKILLs itself after step --kill-after of the starts in --kill-at; with
--kill-in-save, in the middle of its save of that step (its snapshot torn); --kills names several,
"restart:rank:step[:save]" each; --bad-node: every rank started on that Metaflow node SIGKILLs
itself after step --kill-after (a bad machine, for a spare).
Each start writes what it resumed from (start-<restart>-rank-<R>.json: the step, and the start that saved it:
the state holds the start it was saved in); rank 0 writes the final
weights' digest (final.json). --load-mid K: every rank calls load() mid-run on the first start, after its
save of step K (a call that resumes nothing). --sharded: each rank's state saved as its own shard
(``replicated=False``), as FSDP's would be: kept per rank of a world size, and copied to the buddy node."""

import argparse
import hashlib
import os
import signal
import time

import torch
import torch.distributed as dist

from _common import init, rank, write_json

from metaflow_extensions.torchrun.snapshot import load, save

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--mb", type=float, default=48.0, help="the state: weights and momentum, in MB")
p.add_argument("--every", type=int, default=1)
p.add_argument("--kill-rank", type=int, default=-1)
p.add_argument("--kill-at", default="0", help="the restarts at which --kill-rank dies")
p.add_argument("--kill-after", type=int, default=5)
p.add_argument("--kill-in-save", action="store_true")
p.add_argument("--kills", default="", help="restart:rank:step[:save],... (instead of --kill-rank)")
p.add_argument("--bad-node", type=int, default=-1)
p.add_argument("--step-sleep", type=float, default=0.0)
p.add_argument("--mark-steps", action="store_true", help="each rank writes its latest step (at-rank-<R>.json)")
p.add_argument("--load-mid", type=int, default=-1,
               help="on the first start every rank calls load() after its save of this step (mid-load-rank-<R>.json)")
p.add_argument("--sharded", action="store_true", help="save and load with replicated=False")
args = p.parse_args()
replicated = not args.sharded

restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
node = int(os.environ["METAFLOW_TORCHRUN_NODE_INDEX"])
init()
torch.manual_seed(0)
width = 1024
layers = max(1, round(args.mb * (1 << 20) / 8 / (width * width + width)))
model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

first = 0
resumed = load(replicated=replicated)
saved_in = None
if resumed is not None:
    first, state = resumed
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    saved_in = int(state["start"])
write_json("start-%d-rank-%d.json" % (restart, rank()), {"restart": restart, "node": node, "resumed": first,
                                                          "from_memory": resumed is not None, "saved_in": saved_in,
                                                          "world": dist.get_world_size()})


KILLS = {}  # restart -> (rank, step, in its save)
for spec in filter(None, args.kills.split(",")):
    fields = spec.split(":")
    KILLS[int(fields[0])] = (int(fields[1]), int(fields[2]), fields[3:] == ["save"])
if args.kill_rank >= 0:
    for start in args.kill_at.split(","):
        KILLS[int(start)] = (args.kill_rank, args.kill_after, args.kill_in_save)


def failing_step(step: int) -> bool:
    """The step after which a rank dies in this start (every rank knows which, to meet it there)."""
    if args.bad_node >= 0:
        return step == args.kill_after
    return restart in KILLS and step == KILLS[restart][1]


def dies_now(step: int) -> bool:
    if not failing_step(step):
        return False
    return node == args.bad_node if args.bad_node >= 0 else rank() == KILLS[restart][0]


def dies_in_save(step: int) -> bool:
    return dies_now(step) and args.bad_node < 0 and KILLS[restart][2]


for step in range(first, args.steps):
    g = torch.Generator().manual_seed(1000 * step + rank())
    batch = torch.randn(8, width, generator=g)
    opt.zero_grad()
    model(batch).pow(2).mean().backward()
    for param in model.parameters():
        dist.all_reduce(param.grad)
        param.grad /= dist.get_world_size()
    opt.step()
    done = step + 1
    if dies_in_save(done):
        # Torn: the rank dies in its save of this step, half its tensors copied into the node's memory.
        import dataclasses

        from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import saver as snapshot_saver

        copy_in = snapshot_saver.copy_in

        def copy_half_then_die(target, plan, start):
            half = len(plan.tensors) // 2
            copy_in(target, dataclasses.replace(plan, tensors=plan.tensors[:half], specs=plan.specs[:half]), start)
            os.kill(os.getpid(), signal.SIGKILL)

        snapshot_saver.copy_in = copy_half_then_die
    if done % args.every == 0:
        save(done, {"model": model.state_dict(), "opt": opt.state_dict(), "start": torch.tensor(restart)},
             replicated=replicated)
    if restart == 0 and done == args.load_mid:  # nothing restarted: what load() returns, and it claims no resume
        mid = load(replicated=replicated)
        write_json("mid-load-rank-%d.json" % rank(), {"step": mid[0] if mid is not None else None})
    if failing_step(done):
        dist.barrier()  # every rank has saved step `done` before one dies
        if dies_now(done):
            os.kill(os.getpid(), signal.SIGKILL)
    if args.mark_steps:
        write_json("at-rank-%d.json" % rank(), {"restart": restart, "step": done, "world": dist.get_world_size()})
    time.sleep(args.step_sleep)

if rank() == 0:
    digest = hashlib.sha256()
    for tensor in list(model.state_dict().values()) + [s["momentum_buffer"] for s in opt.state_dict()["state"].values()]:
        digest.update(tensor.contiguous().numpy().tobytes())
    write_json("final.json", {"digest": digest.hexdigest(), "steps": args.steps})
