"""A checkpoint that needs every rank, saved when told to stop (SIGTERM).

The handler pauses MFTR_SAVE_SECONDS (a long save), then enters an all_reduce
with every other rank (as torch.distributed.checkpoint, FSDP's and DeepSpeed's
state dicts, or a barrier before rank 0 saves do), then writes its file. It
completes only if every rank of every node got SIGTERM and enough time: a node
whose ranks are killed early leaves the others waiting in the collective."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from _common import init, rank, write_json

STARTED = time.time()


def save_and_exit(signum, frame):
    told = time.time()
    write_json("told-%d.json" % rank(), {"rank": rank(), "at": told})
    time.sleep(float(os.environ.get("MFTR_SAVE_SECONDS", "5")))
    total = torch.ones(1)
    dist.all_reduce(total)
    write_json("ckpt-%d.json" % rank(), {"rank": rank(), "signal": signum, "told": told, "sum": total.item(),
                                        "saved": time.time()})
    sys.exit(0)


signal.signal(signal.SIGTERM, save_and_exit)
init()
dist.barrier()
write_json("ready-%d.json" % rank(), {"rank": rank()})
while True:
    time.sleep(0.1)
