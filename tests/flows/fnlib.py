"""Functions in a module of their own, for function-entrypoint tests."""

import os


def describe(tag):
    """No process group: report the torchrun environment this rank sees."""
    return {
        "tag": tag,
        "rank": int(os.environ["RANK"]),
        "world": int(os.environ["WORLD_SIZE"]),
        "local_rank": int(os.environ["LOCAL_RANK"]),
    }


def raise_on(rank):
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == rank:
        raise ValueError("bad value on purpose")
    dist.barrier()  # the others wait here until the gang stops them
