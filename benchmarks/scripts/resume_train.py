"""benchmarks/resume.py's training job: a tiny DDP model, a checkpoint saved
from rank 0 every epoch with metaflow-checkpoint's ``Checkpoint``, and one
failure (``--fail``) after epoch ``--after`` of the first start only.

Every rank appends what it did, with its clock, to $BENCH_OUT/events.jsonl:
``script`` is the first line of this file (before ``import torch``), then
``imported``, ``group`` (init_process_group done), ``start`` (the DDP model
built: the first training line), ``epoch``, ``kill``/``raise``.
"""

import json
import os
import time

T0 = time.time()


def note(event: str, **what) -> None:
    what.update(event=event, pid=os.getpid(), rank=int(os.environ["RANK"]), node=int(os.environ["GROUP_RANK"]),
                restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    what.setdefault("t", time.time())
    with open(os.path.join(os.environ["BENCH_OUT"], "events.jsonl"), "a") as f:
        f.write(json.dumps(what) + "\n")


note("script", t=T0)

import argparse  # noqa: E402
import signal  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--attempt", type=int, default=0)
p.add_argument("--fail", default="node-kill")
p.add_argument("--after", type=int, default=1)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--resume-dir", default=None)
args = p.parse_args()
note("imported", attempt=args.attempt)
dist.init_process_group("gloo")
note("group", attempt=args.attempt)
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
first = 1
if args.resume_dir:
    state = torch.load(os.path.join(args.resume_dir, "model.pt"))
    model.module.load_state_dict(state["model"])
    first = state["epoch"] + 1
note("start", attempt=args.attempt, resumed_from=first - 1 if args.resume_dir else None)
print("training from epoch %d" % first, flush=True)
first_start = args.attempt == 0 and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
failing = first_start and os.environ["GROUP_RANK"] == "1" and os.environ["LOCAL_RANK"] == "1"
for epoch in range(first, args.epochs + 1):
    for _ in range(4):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    note("epoch", attempt=args.attempt, epoch=epoch)
    if dist.get_rank() == 0:
        from metaflow import Checkpoint  # the task's @checkpoint, inherited

        checkpoint = Checkpoint(init_dir=True)
        torch.save({"model": model.module.state_dict(), "epoch": epoch}, os.path.join(checkpoint.directory, "model.pt"))
        checkpoint.save(metadata={"epoch": epoch})
    dist.barrier()
    if failing and epoch == args.after:
        if args.fail == "node-kill":
            with open(os.path.join(os.environ["BENCH_OUT"], "task-pid-1")) as f:
                pid = int(f.read())
            note("kill", attempt=args.attempt, target=pid)
            os.kill(pid, signal.SIGKILL)
            time.sleep(60)  # the gang stops this rank
        elif args.fail == "rank-kill":
            note("kill", attempt=args.attempt, target=os.getpid())
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            note("kill", attempt=args.attempt, target=None)
            raise RuntimeError("the benchmark's failure after epoch %d" % epoch)
dist.destroy_process_group()
