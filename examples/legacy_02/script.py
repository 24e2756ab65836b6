"""A torchrun script as 0.2 users wrote them: argparse, a store_true flag, gloo."""

import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--message", default="hello")
parser.add_argument("--verbose", action="store_true")
args = parser.parse_args()

dist.init_process_group("gloo")
total = torch.tensor([1.0])
dist.all_reduce(total)
if args.verbose:
    print("rank %d of %d (node %s): %s; all-reduce saw %d ranks"
          % (dist.get_rank(), dist.get_world_size(), os.environ.get("GROUP_RANK"), args.message, int(total.item())))
out = os.environ.get("MFTR_TEST_OUT")
if out:
    with open(os.path.join(out, "legacy-%s-rank-%d.txt" % (dist.get_world_size(), dist.get_rank())), "w") as f:
        f.write("%s %d\n" % (args.message, int(total.item())))
dist.destroy_process_group()
