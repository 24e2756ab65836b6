"""Every rank reports who it is and the all-reduce of all ranks."""

import os
import sys

import torch
import torch.distributed as dist

from _common import init, rank, write_json

init()
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
write_json(
    "rank-%d.json" % rank(),
    {
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "group_rank": int(os.environ["GROUP_RANK"]),
        "node_index": int(os.environ["METAFLOW_TORCHRUN_NODE_INDEX"]),
        "sum": int(total.item()),
        "argv": sys.argv[1:],
    },
)
dist.destroy_process_group()
