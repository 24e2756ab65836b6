"""Text the console must show as written (issue 83): every rank prints a line
with stars in it, and rank 1 makes torch write a C++ warning of its own, which
torch labels ``[rank1]:`` itself once the process group is up (a store client
that waits 50 ms for a key nobody sets)."""

import datetime
import os

import torch.distributed as dist

from _common import init, rank

STARS = "step must be an int from 0 to 2**53; lambda s: 0.9 ** s; f(*args, **kwargs)"

init()
print("rank %d says: %s" % (rank(), STARS), flush=True)
if rank() == 1:
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(milliseconds=50))
    try:
        store.get("console-text-never-set")
    except Exception as e:  # torch's DistStoreError, after its C++ warnings
        print("rank 1's store wait ended: %s" % type(e).__name__, flush=True)
    del store
dist.barrier()
dist.destroy_process_group()
