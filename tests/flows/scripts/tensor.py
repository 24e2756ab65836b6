"""Rank 0 prints a 200-line tensor several times, as one write each (issue 36)."""

import sys
import time

import torch

torch.set_printoptions(profile="full", linewidth=60)
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
    t = torch.arange(200 * 4, dtype=torch.int64).reshape(200, 4) + i
    print("tensor %d begins\n%s\ntensor %d ends" % (i, t, i), flush=True)
    time.sleep(0.1)
