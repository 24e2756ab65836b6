"""Node 1's first rank blocks in an all-reduce no other rank joins; the others
idle quietly. (torchrun, not Metaflow, numbers the ranks: node 1's may be any.)"""

import os
import time

import torch
import torch.distributed as dist

from _common import init, rank, write_json

init()
dist.barrier()
write_json("ready-%d.json" % rank(), {"rank": rank()})
if os.environ["METAFLOW_TORCHRUN_NODE_INDEX"] == "1" and os.environ["LOCAL_RANK"] == "0":
    write_json("stuck.json", {"rank": rank()})
    dist.all_reduce(torch.zeros(1))  # stuck: the collective no other rank joins
while True:
    time.sleep(0.1)
