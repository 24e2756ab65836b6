"""Without torch (fast): the rank given by --rank is killed by SIGKILL, as a
node's hardware fault would end it; the others wait to be stopped. With
--rank -1 every rank prints a line and ends."""

import argparse
import os
import signal
import time

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, default=1)
args = p.parse_args()
print("rank %s up" % os.environ["RANK"], flush=True)
if args.rank < 0:
    raise SystemExit(0)
if int(os.environ["RANK"]) == args.rank:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)
