"""A plain training loop that reports progress (no torch): every rank takes
``--every`` seconds a step, ``--slow-rank`` three times as long."""

import argparse
import os
import time

from metaflow_extensions.torchrun.progress import report

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=8.0)
parser.add_argument("--every", type=float, default=0.05)
parser.add_argument("--slow-rank", type=int, default=-1)
args = parser.parse_args()

rank = int(os.environ["RANK"])
pause = args.every * (3 if rank == args.slow_rank else 1)
total = int(args.seconds / args.every)
end = time.monotonic() + args.seconds
step = 0
while time.monotonic() < end:
    time.sleep(pause)
    step += 1
    report(step, total=total, loss=1.0 / step, lr=0.001)
print("rank %d did %d steps" % (rank, step))
