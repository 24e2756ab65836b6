"""Saves a checkpoint when told to stop (SIGTERM), as a preemptible job would.

The save takes MFTR_SAVE_SECONDS: longer than a failure's short grace, so only
a graceful shutdown lets it finish."""

import os
import signal
import sys
import time

import torch.distributed as dist

from _common import init, rank, write_json

STARTED = time.time()


def save_and_exit(signum, frame):
    time.sleep(float(os.environ.get("MFTR_SAVE_SECONDS", "5")))
    write_json("ckpt-%d.json" % rank(), {"rank": rank(), "signal": signum, "ran": time.time() - STARTED})
    sys.exit(0)


signal.signal(signal.SIGTERM, save_and_exit)
init()
dist.barrier()
write_json("ready-%d.json" % rank(), {"rank": rank()})
while True:
    time.sleep(0.1)
