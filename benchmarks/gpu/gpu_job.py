"""What each rank of the GPU check runs: an all-reduce, a device-side assert, a
few hundred DDP steps of a small transformer in bf16, a desync (``skip``: rank 1
skips an all-reduce the others wait in on the GPU, their CPU thread in
``torch.cuda.synchronize``, where no stack shows a collective), or a rank
killed while the others are in collectives (``kill``)."""

import os
import signal
import statistics
import sys
import time

FIRST_LINE_AT = time.time()
print("first line of rank %s" % os.environ.get("RANK"), flush=True)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main(kind: str, out: str) -> None:
    rank = int(os.environ["RANK"])
    with open(os.path.join(out, "first-line-%d" % rank), "w") as f:
        f.write(repr(FIRST_LINE_AT))
    cuda = torch.cuda.is_available() and kind != "cpu"
    backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend)
    device = torch.device("cuda") if cuda else torch.device("cpu")
    if kind == "assert":
        index = torch.tensor([1 << 20], device=device)
        torch.zeros(4, device=device)[index].sum().item()  # out of bounds: device-side assert
    elif kind == "train":
        train(device, rank, out)
    elif kind in ("skip", "kill"):
        desync(kind, device, rank, out)
    else:
        total = torch.tensor([float(rank)], device=device)
        dist.all_reduce(total)
        print("rank %d of world %d (%s): all-reduce sum %d"
              % (rank, dist.get_world_size(), backend, int(total.item())), flush=True)
    dist.destroy_process_group()


def desync(kind: str, device, rank: int, out: str) -> None:
    """Collectives in step on every rank, then rank 1 leaves them: it sleeps
    (``skip``, a hang the gang's hang_timeout stops and whose culprit NCCL's
    recorder names), or it is SIGKILLed (``kill``, the time written first)."""
    t = torch.ones(1 << 20, device=device)
    for _ in range(5):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    print("rank %d: 5 all-reduces done on %s" % (rank, dist.get_backend()), flush=True)
    if rank == 1:
        if kind == "kill":
            with open(os.path.join(out, "killed-at"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        while True:
            time.sleep(1)
    while True:  # the others: the 6th all-reduce waits for rank 1 on the GPU
        dist.all_reduce(t)
        torch.cuda.synchronize()


def train(device, rank: int, out: str, steps: int = 120, warmup: int = 20) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    layer = torch.nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True)
    model = DDP(torch.nn.TransformerEncoder(layer, num_layers=8).to(device))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(16, 256, 1024, device=device)
    times = []
    for i in range(steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t)
    if rank == 0:
        with open(os.path.join(out, "step-median"), "w") as f:
            f.write(repr(statistics.median(times)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
