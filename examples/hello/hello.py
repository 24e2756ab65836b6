"""Each rank reports itself, then all ranks all-reduce their rank numbers."""

import os
import socket

import torch
import torch.distributed as dist


def main() -> None:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda") if backend == "nccl" else torch.device("cpu")
    total = torch.tensor([float(rank)], device=device)
    dist.all_reduce(total)
    print(
        "hello from rank %d of %d (local rank %s, node %s, host %s): all-reduce sum %d"
        % (rank, world, os.environ["LOCAL_RANK"], os.environ["GROUP_RANK"],
           socket.gethostname(), int(total.item())),
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
