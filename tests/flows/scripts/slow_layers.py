"""A model of --layers layers on gloo, trained with DDP (--model ddp: a gradient bucket a layer, from a
small bucket_cap_mb) or FSDP2 (--model fsdp: fully_shard on each layer), that reports its progress. Every
rank's step has the same work, sleeps standing in for a device: --forward ms, then --backward ms spread
over the layers, before each layer's backward (a backward pre-hook). Rank --slow-rank does its layers'
backward slower, by (--slow - 1) of the step as it took when even (a slower device): every rank is even for
--even-seconds (the gang's first seconds, which the arrival signal does not count), then rank --slow-rank
is slow for --seconds. Rank 0 writes each phase's steps and seconds (pace.json, the second half of each
phase: their ratio is the step-time ratio the slow rank causes), how many collectives a step made and the
DDP buckets (shape.json), and the wall time the slow phase began (started.json); the slow rank, the extra
it sleeps a layer (extra.json)."""

import argparse
import json
import sys
import time

import torch
import torch.distributed as dist

from _common import init, rank, write_json
from metaflow_extensions.torchrun.progress import report

p = argparse.ArgumentParser()
p.add_argument("--model", choices=("ddp", "fsdp"), default="ddp")
p.add_argument("--layers", type=int, default=8)
p.add_argument("--width", type=int, default=512)
p.add_argument("--forward", type=float, default=20.0)
p.add_argument("--backward", type=float, default=64.0)
p.add_argument("--slow", type=float, default=1.25)
p.add_argument("--slow-rank", type=int, default=3)
p.add_argument("--seconds", type=float, default=40.0)
p.add_argument("--even-seconds", type=float, default=10.0)
args = p.parse_args()

init()
torch.manual_seed(0)
layers = [torch.nn.Linear(args.width, args.width) for _ in range(args.layers)]
model = torch.nn.Sequential(*layers)
if args.model == "ddp":
    mb = 0.99 * args.width * (args.width + 1) * 4 / 2 ** 20  # a layer's gradients (MiB): a bucket each
    model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=mb)
else:
    from torch.distributed.fsdp import fully_shard

    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
each = args.backward / args.layers / 1000.0
state = {"extra": 0.0, "hooks": 0}  # the slow rank's extra a layer, once it is slow


def layer_backward(module, grad_output):
    state["hooks"] += 1
    time.sleep(each + state["extra"])


for layer in layers:
    layer.register_full_backward_pre_hook(layer_backward)
opt = torch.optim.SGD(model.parameters(), lr=0.001)
batch = torch.randn(16, args.width, requires_grad=True)  # a layer's hook sees a gradient from the first
done = torch.zeros(1)
began = time.time()
phases = {"slow": [], "even": []}  # (time, step) of each
step, first_seq = 0, None
c10d = sys.modules["torch._C._distributed_c10d"]
while True:
    now = time.time()
    slow = now - began >= args.even_seconds
    if slow and not phases["slow"]:
        if rank() == 0:
            write_json("started.json", {"at": now})
        if rank() == args.slow_rank:  # (slow - 1) of its step as it took when even, spread over its layers
            half = phases["even"][len(phases["even"]) // 2:]
            step_s = (half[-1][0] - half[0][0]) / max(1, half[-1][1] - half[0][1])
            state["extra"] = (args.slow - 1.0) * step_s / args.layers
            write_json("extra.json", {"step_s": step_s, "extra_s": state["extra"]})
    done.fill_(1.0 if now - began >= args.seconds + args.even_seconds else 0.0)
    dist.all_reduce(done)  # the step's metric, all-reduced: every rank stops at the same step
    if done.item() > 0:
        break
    time.sleep(args.forward / 1000.0)
    opt.zero_grad()
    model(batch).sum().backward()
    opt.step()
    step += 1
    report(step)
    phases["slow" if slow else "even"].append((time.time(), step))
if rank() == 0:
    pace = {}
    for name, seen in phases.items():
        half = seen[len(seen) // 2:]
        pace[name] = {"steps": half[-1][1] - half[0][1], "seconds": half[-1][0] - half[0][0]}
    write_json("pace.json", pace)
    buckets = model._get_ddp_logging_data().get("bucket_sizes") if args.model == "ddp" else None
    entries = json.loads(c10d._dump_fr_trace_json(True, False))["entries"]
    seqs = [e["collective_seq_id"] for e in entries if e["process_group"][0] == "0"]
    write_json("shape.json", {"buckets": buckets, "per_step": max(seqs) / step if seqs and step else None,
                              "hooks_per_step": state["hooks"] / max(1, step)})
