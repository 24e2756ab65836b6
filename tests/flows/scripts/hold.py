"""Signal readiness with the gang's group up, then wait for the test's `release`
file (at most 120 s) and finish normally: the test looks at the job's sockets
and store while every process of it is alive."""

import os
import time

import torch.distributed as dist

from _common import init, out_dir, rank, write_json

init()
dist.barrier()
write_json("ready-%d.json" % rank(), {"rank": rank(), "pid": os.getpid()})
release = os.path.join(out_dir(), "release")
deadline = time.monotonic() + 120
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.1)
dist.barrier()
dist.destroy_process_group()
