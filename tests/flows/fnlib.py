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


def quiet_wait(seconds):
    """Talks while it starts (silence is what hang_timeout measures; a shell,
    as scripts/_common.py says why), says it is ready, then is silent."""
    import subprocess
    import time

    chatter = subprocess.Popen(
        ["/bin/sh", "-c", "while kill -0 %d 2>/dev/null; do echo starting...; sleep 1; done" % os.getpid()])
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    chatter.kill()
    chatter.wait()
    print("rank %d ready" % dist.get_rank(), flush=True)
    time.sleep(seconds)  # quiet here


def hold():
    """Says it runs (rank, pid) in the test's out directory, then waits for the
    test's `release` file (at most 120 s): the test looks at the live ranks."""
    import json
    import time

    out, rank = os.environ["MFTR_TEST_OUT"], int(os.environ["RANK"])
    path = os.path.join(out, "ready-%d.json" % rank)
    with open(path + ".tmp", "w") as f:
        json.dump({"rank": rank, "pid": os.getpid()}, f)
    os.replace(path + ".tmp", path)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out, "release")) and time.monotonic() < deadline:
        time.sleep(0.1)
    return rank
