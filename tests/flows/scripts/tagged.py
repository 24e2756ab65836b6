"""An all-reduce; reports to ``<tag>-rank-<N>.json`` so calls can be told apart."""

import sys

import torch
import torch.distributed as dist

from _common import init, rank, write_json

tag = sys.argv[1] if len(sys.argv) > 1 else "call"
init()
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
write_json("%s-rank-%d.json" % (tag, rank()), {"world": dist.get_world_size(), "sum": int(total.item())})
dist.destroy_process_group()
