"""The job of benchmarks/snapshot_resume.py: data-parallel training of a ~48 MB state (weights and SGD
momentum) that keeps it either in the nodes' memory (``snapshot.save`` every --every steps) or on disk
(``torch.save`` by rank 0 every --disk-every steps, into --disk-dir), and resumes from whichever it has.
A variant of tests/flows/scripts/snapshot_train.py with a disk checkpoint, failures on a schedule, and
wall-clock stamps for the benchmark.

Failures: --fail "S:WHO,S:WHO,..." -- the i-th start (restart i) fails once its ranks completed step S;
WHO is ``rank:R`` (global rank R SIGKILLs itself) or ``node:N`` (every rank started on Metaflow node N).
The dying ranks die at the top of the next step, after their save of step S returned: no barrier, so the
other ranks may be in the next step's all-reduce, as in a real failure.

Stamps, under $MFTR_TEST_OUT: ``start-<restart>-rank-<R>.json`` (where it resumed, from what, when the
script began and when the state was loaded), ``steps-<restart>-rank-<R>.jsonl`` (per step: when it
completed, its compute, its snapshot save, its disk save, in seconds), ``kill-<restart>-rank-<R>.json``
(the wall-clock time a rank SIGKILLed itself, and its last completed step)."""

import argparse
import json
import os
import signal
import time

T_SCRIPT = time.time()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from metaflow_extensions.torchrun.progress import report  # noqa: E402
from metaflow_extensions.torchrun.snapshot import load, save  # noqa: E402

T_IMPORTED = time.time()

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--mb", type=float, default=48.0, help="the state: weights and momentum, in MB")
p.add_argument("--batch", type=int, default=8)
p.add_argument("--every", type=int, default=1, help="a snapshot every N steps; 0: none")
p.add_argument("--disk-every", type=int, default=0, help="a disk checkpoint every E steps; 0: none")
p.add_argument("--disk-dir", default="")
p.add_argument("--fail", default="", help="S:rank:R or S:node:N, one per start, comma separated")
p.add_argument("--step-sleep", type=float, default=0.0)
args = p.parse_args()

OUT = os.environ["MFTR_TEST_OUT"]
os.makedirs(OUT, exist_ok=True)
RESTART = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
NODE = int(os.environ["METAFLOW_TORCHRUN_NODE_INDEX"])
RANK = int(os.environ["RANK"])
DISK = os.path.join(args.disk_dir or os.path.join(OUT, "ckpt"), "state.pt")


def write_json(name, data):
    path = os.path.join(OUT, name)
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def this_start_failure():
    """(step, dies here) of this start's failure, or None."""
    plan = [x for x in args.fail.split(",") if x]
    if RESTART >= len(plan):
        return None
    step, who, which = plan[RESTART].split(":")
    dies = (who == "rank" and RANK == int(which)) or (who == "node" and NODE == int(which))
    return int(step), dies


def resume(model, opt):
    """The newest state this gang can resume from: memory first, then the disk checkpoint."""
    resumed = load()
    if resumed is not None:
        step, state = resumed
        source = "memory"
    elif args.disk_every and os.path.exists(DISK):
        state = torch.load(DISK)
        step, source = state["step"], "disk"
    else:
        return 0, None
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    return step, source


def disk_save(step, model, opt):
    """Rank 0 writes the whole state (every rank holds the same), atomically."""
    if RANK != 0:
        return
    os.makedirs(os.path.dirname(DISK), exist_ok=True)
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, DISK + ".tmp")
    os.replace(DISK + ".tmp", DISK)


dist.init_process_group("gloo")
T_GROUP = time.time()
torch.manual_seed(0)
width = 1024
layers = max(1, round(args.mb * (1 << 20) / 8 / (width * width + width)))
model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
T_BUILT = time.time()
first, source = resume(model, opt)
write_json("start-%d-rank-%d.json" % (RESTART, RANK), {"restart": RESTART, "node": NODE, "rank": RANK, "resumed": first,
                                                        "source": source, "script_at": T_SCRIPT, "imported_at": T_IMPORTED,
                                                        "group_at": T_GROUP, "built_at": T_BUILT, "loaded_at": time.time()})
failure = this_start_failure()
log = open(os.path.join(OUT, "steps-%d-rank-%d.jsonl" % (RESTART, RANK)), "a", buffering=1)

for step in range(first, args.steps):
    if failure is not None and failure[1] and step == failure[0]:
        write_json("kill-%d-rank-%d.json" % (RESTART, RANK), {"at": time.time(), "step": step})
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(1000 * step + RANK)
    batch = torch.randn(args.batch, width, generator=g)
    opt.zero_grad()
    model(batch).pow(2).mean().backward()
    for param in model.parameters():
        dist.all_reduce(param.grad)
        param.grad /= dist.get_world_size()
    opt.step()
    t1 = time.perf_counter()
    done = step + 1
    if args.every and done % args.every == 0:
        save(done, {"model": model.state_dict(), "opt": opt.state_dict()})
    t2 = time.perf_counter()
    if args.disk_every and done % args.disk_every == 0:
        disk_save(done, model, opt)
    t3 = time.perf_counter()
    log.write(json.dumps({"step": done, "at": time.time(), "compute": round(t1 - t0, 5), "save": round(t2 - t1, 5),
                          "disk": round(t3 - t2, 5)}) + "\n")
    report(done, total=args.steps)  # where a restart resumed, for the goodput ledger, snapshot or not
    time.sleep(args.step_sleep)
log.close()
