"""One rank (node 1, local rank 1) skips an all_reduce the other three wait in,
and goes on quietly elsewhere: a desync, the hang hang_timeout stops. Every
rank talks while it starts (silence is what hang_timeout measures).
MFTR_ASYNC=1: the others issue it with async_op=True and wait on its work, so
no frame of torch's collectives is on their stacks."""

import os
import time

from _common import done_starting, init, rank, talk_while_starting, write_json

chatter = talk_while_starting()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

init()
dist.barrier()
done_starting(chatter)
write_json("ready-%d.json" % rank(), {"rank": rank()})
if os.environ["METAFLOW_TORCHRUN_NODE_INDEX"] == "1" and os.environ["LOCAL_RANK"] == "1":
    write_json("skipper.json", {"rank": rank()})
    while True:
        time.sleep(0.1)  # skipped the all_reduce: the others wait for it here
if os.environ.get("MFTR_ASYNC") == "1":
    dist.all_reduce(torch.ones(1), async_op=True).wait()
else:
    dist.all_reduce(torch.ones(1))

