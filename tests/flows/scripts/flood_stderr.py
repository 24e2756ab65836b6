"""Write megabytes to stderr only, then a last line with no newline."""

import argparse
import sys

from _common import rank

p = argparse.ArgumentParser()
p.add_argument("--mb", type=int, default=8)
args = p.parse_args()
line = ("x" * 1023 + "\n").encode()
for _ in range(args.mb * 1024):
    sys.stderr.buffer.write(line)
sys.stderr.buffer.write(b"FLOOD-END rank %d" % rank())
sys.stderr.flush()
