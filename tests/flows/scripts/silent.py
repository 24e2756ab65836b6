"""Every rank talks while it starts (imports and the rendezvous are slow on a
small machine, and silence is what hang_timeout measures), says it is ready,
then sleeps without a word."""

import time

from _common import done_starting, init, rank, talk_while_starting, write_json

chatter = talk_while_starting()
import torch.distributed as dist  # noqa: E402

init()
dist.barrier()
done_starting(chatter)
print("rank %d ready, going quiet" % rank(), flush=True)
write_json("ready-%d.json" % rank(), {"rank": rank()})
time.sleep(3600)  # silent
