"""Log throughput: every rank writes --lines numbered lines to stdout, one write
each, then all ranks meet at a barrier so the job ends when every line is out.

Each line: ``BENCHLOG rank=<r> seq=<i> <padding> END`` (80 bytes or so); a reader
counts a line only if all of it arrived, wherever in the line a prefix (a rank
label, a timestamp) was put by the launcher or the log system.
"""

import argparse
import sys

import torch.distributed as dist

from _bench import init, rank

PAD = "x" * 48

p = argparse.ArgumentParser()
p.add_argument("--lines", type=int, default=100000)
args = p.parse_args()
init()
r = rank()
write = sys.stdout.write
flush = sys.stdout.flush
for i in range(args.lines):
    write("BENCHLOG rank=%d seq=%d %s END\n" % (r, i, PAD))
    flush()
dist.barrier()
dist.destroy_process_group()
