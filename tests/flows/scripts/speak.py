"""One line on each stream, naming the rank: whose output landed where. No
process group (nothing to wait for)."""

import os
import sys

rank = os.environ["RANK"]
print("stdout of rank %s" % rank, flush=True)
print("stderr of rank %s" % rank, file=sys.stderr, flush=True)
