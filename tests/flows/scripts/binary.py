"""Write bytes that are not UTF-8 between two readable markers."""

import sys

from _common import rank

sys.stdout.buffer.write(b"BIN-START rank %d \xff\xfe\x80\xc3 BIN-END rank %d\n" % (rank(), rank()))
sys.stdout.flush()
