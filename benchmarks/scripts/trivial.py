"""The trivial job: join the group, one barrier, leave."""

import torch.distributed as dist

from _bench import init

init()
dist.barrier()
dist.destroy_process_group()
