"""Node 1's first rank blocks in an all-reduce no other rank joins; the others
idle quietly. (torchrun, not Metaflow, numbers the ranks: node 1's may be any.)
Every rank talks while it starts (silence is what hang_timeout measures: its
clock runs from the call's start, through imports and the rendezvous)."""

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
if os.environ["METAFLOW_TORCHRUN_NODE_INDEX"] == "1" and os.environ["LOCAL_RANK"] == "0":
    write_json("stuck.json", {"rank": rank()})
    dist.all_reduce(torch.zeros(1))  # stuck: the collective no other rank joins
while True:
    time.sleep(0.1)
