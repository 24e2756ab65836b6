"""Each rank prints --lines numbered lines on stdout (and a few on stderr)."""

import argparse
import sys

from _common import rank

p = argparse.ArgumentParser()
p.add_argument("--lines", type=int, default=1000)
args = p.parse_args()
r = rank()
out = sys.stdout
for i in range(args.lines):
    out.write("LINE %d %d payload-%s\n" % (r, i, "x" * (i % 37)))
sys.stderr.write("ERRLINE %d done\n" % r)
