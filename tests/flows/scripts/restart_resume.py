"""A training loop that saves its own checkpoint every step and resumes from
it: for @torchrun(restarts=N). One rank SIGKILLs itself (or raises, --bug)
after step --fail-after of the restarts named in --fail-at, once every rank
saved that step (--slow-save: one of them late to it); every start writes
which restart it is, where each rank runs and what it resumed from.

For @torchrun(spares=K): --bad-node is a "bad GPU" on one Metaflow node: every
rank that starts there SIGKILLs itself after step --fail-after of its start,
whatever its node rank; --bug-rank raises ValueError at the restarts named in
--bug-at (a bug in the user's code, after a restart of another cause)."""

import time

STARTED = time.time()  # the script's first line: where a restart's cost ends (benchmarks/restart_scale.py)

import sys  # noqa: E402

WARM = "torch" in sys.modules  # forked from the node's warm process (METAFLOW_TORCHRUN_WARM_START)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from _common import init, out_dir, rank  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=3)
p.add_argument("--fail-rank", type=int, default=3)
p.add_argument("--fail-at", default="0,1", help="restart counts at which --fail-rank fails")
p.add_argument("--fail-after", type=int, default=1, help="steps done (and saved) before it fails")
p.add_argument("--bug", action="store_true", help="raise ValueError instead of SIGKILL")
p.add_argument("--slow-save", type=int, default=-1, help="a rank 1 s late to its save at each failing step")
p.add_argument("--bad-node", type=int, default=-1, help="Metaflow node whose ranks SIGKILL themselves every start")
p.add_argument("--bug-rank", type=int, default=-1, help="the rank that raises ValueError at the --bug-at restarts")
p.add_argument("--bug-at", default="", help="restart counts at which --bug-rank raises")
args = p.parse_args()

restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
node = int(os.environ["METAFLOW_TORCHRUN_NODE_INDEX"])  # the Metaflow node, not torchrun's node rank
ckpt = os.path.join(out_dir(), "ckpt-rank-%d.json" % rank())
resumed = None
if os.path.exists(ckpt):
    with open(ckpt) as f:
        resumed = json.load(f)["step"]


def parent_of(pid: int) -> int:
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def task_pid() -> int:
    """The parent of the process that started this rank: the Metaflow task (a
    fresh start's agent, or the node's warm process), or the warm process the
    node's own was forked from."""
    return parent_of(os.getppid())


def host_forked() -> bool:
    """This node's warm process was forked from another's: the run's (Metaflow's
    runtime's, for the control), or the control's (a local run's other nodes)."""
    with open("/proc/%d/comm" % task_pid()) as f:
        return f.read().strip() == "mftr-zygote"


init()
with open(os.path.join(out_dir(), "events.jsonl"), "a") as f:
    f.write(json.dumps({"restart": restart, "rank": rank(), "group_rank": int(os.environ["GROUP_RANK"]),
                        "node": node, "world_size": int(os.environ["WORLD_SIZE"]), "resumed_from": resumed,
                        "task_pid": task_pid(), "script_at": STARTED, "warm": WARM,
                        "host_forked": host_forked(), "parent": os.getppid()}) + "\n")
fail_at = {int(x) for x in args.fail_at.split(",") if x}
bug_at = {int(x) for x in args.bug_at.split(",") if x}
for step in range((resumed or 0) + 1, args.steps + 1):
    t = torch.ones(1)
    dist.all_reduce(t)
    at_fail_step = step == args.fail_after + (resumed or 0)
    failing = restart in fail_at and at_fail_step
    if rank() == args.slow_save and failing:
        time.sleep(1.0)  # a loaded machine's descheduled rank
    tmp = ckpt + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step}, f)
    os.replace(tmp, ckpt)
    # Every rank has saved this step before any fails: a peer's agent stops it as soon as the failing
    # rank dies, and under load that came before its save (the restart then resumed from no step).
    dist.barrier()
    if rank() == args.bug_rank and restart in bug_at and at_fail_step:
        raise ValueError("a bug in the training loop")
    if rank() == args.fail_rank and failing:
        if args.bug:
            raise ValueError("a bug in the training loop")
        os.kill(os.getpid(), signal.SIGKILL)
    if node == args.bad_node and at_fail_step:
        os.kill(os.getpid(), signal.SIGKILL)  # a bad GPU: its ranks die wherever torchrun placed them
dist.barrier()
with open(os.path.join(out_dir(), "done-%d.json" % rank()), "w") as f:
    json.dump({"restart": restart, "steps": args.steps}, f)
dist.destroy_process_group()
