"""Report argv exactly as received; no process group needed."""

import sys

from _common import rank, write_json

write_json("argv-%d.json" % rank(), sys.argv[1:])
