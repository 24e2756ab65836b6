"""Captures the Flight Recorder dumps test_flight.py reads: real JSON of torch's
gloo backend (2.13.0+cpu), not text written by hand.

    TORCH_FR_BUFFER_SIZE=6 torchrun --nproc-per-node 2 capture.py hang DIR
    TORCH_FR_BUFFER_SIZE=0 torchrun --nproc-per-node 2 capture.py off DIR

``hang``: 3 all_reduces and a barrier on the default group, one all_reduce on a
second group, then rank 0 waits in an asynchronous all_reduce that rank 1
skips; each rank dumps while that is so (rank 0 from a thread, its main thread
blocked in ``work.wait()``). ``off``: one all_reduce with the recorder off.
"""

import datetime
import os
import sys
import threading
import time

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist

kind, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(2)


def dump(tag: str) -> None:
    with open(os.path.join(out, "gloo-%s-rank%d.json" % (tag, rank)), "wb") as f:
        f.write(c10d._dump_fr_trace_json(True, False))


if kind == "off":
    dist.all_reduce(t)
    if rank == 0:
        dump("off")
    os._exit(0)
second = dist.new_group([0, 1])
for _ in range(3):
    dist.all_reduce(t)
dist.all_reduce(t, group=second)
dist.barrier()
if rank == 0:
    threading.Thread(target=lambda: (time.sleep(1.5), dump("hang"))).start()
    try:
        dist.all_reduce(t, async_op=True).wait(timeout=datetime.timedelta(seconds=4))
    except RuntimeError:
        pass
    time.sleep(0.5)
else:
    time.sleep(2.5)
    dump("hang")
    time.sleep(2.5)
os._exit(0)
