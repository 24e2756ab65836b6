"""Every rank talks while it starts (imports and the rendezvous are slow on a
small machine, and silence is what hang_timeout measures), says it is ready,
then sleeps without a word."""

import threading
import time

ready = threading.Event()


def chatter():
    while not ready.wait(1.0):
        print("starting...", flush=True)


threading.Thread(target=chatter, daemon=True).start()

import torch.distributed as dist  # noqa: E402

from _common import init, rank, write_json  # noqa: E402

init()
dist.barrier()
ready.set()
print("rank %d ready, going quiet" % rank(), flush=True)
write_json("ready-%d.json" % rank(), {"rank": rank()})
time.sleep(3600)  # silent
