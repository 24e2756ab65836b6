"""Rank 1 fails on the first try: of torchrun's restarts (--mode restart) or of
Metaflow's @retry (--mode retry, remembered by a marker file)."""

import argparse
import os

import torch
import torch.distributed as dist

from _common import init, out_dir, rank, write_json

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["restart", "retry"], required=True)
args = p.parse_args()
init()
dist.barrier()
restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
marker = os.path.join(out_dir(), "failed-once")
if rank() == 1:
    if args.mode == "restart" and restarts == 0:
        raise RuntimeError("first try fails (restart count 0)")
    if args.mode == "retry" and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("first attempt fails")
t = torch.ones(1)
dist.all_reduce(t)
write_json("rank-%d.json" % rank(), {"restarts": restarts, "sum": int(t.item())})
dist.destroy_process_group()
