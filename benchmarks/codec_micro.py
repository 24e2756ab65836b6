"""The gang's messages through the codec, one at a time: record to dict (to_wire), dict to checked
record (parse), record to the wire's bytes (to_line), bytes to checked record (from_line).
Microseconds, the least of ``repeat`` runs of ``number`` (this thread's CPU time, so a busy
machine's other work counts less). Prints one JSON object: run it on two commits and compare.

    python benchmarks/codec_micro.py [number] [repeat]
"""

from __future__ import annotations

import json
import sys
import time
import timeit

import metaflow  # noqa: F401  (the package expects Metaflow imported first)
from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.gang import messages as m
from metaflow_extensions.torchrun.plugins.torchrun.gang import wire

try:
    from metaflow_extensions.torchrun.plugins.torchrun.gang.gang_progress import NodeProgress
except ImportError:  # before the gang's progress modules were one
    from metaflow_extensions.torchrun.plugins.torchrun.gang.node_progress import NodeProgress  # type: ignore

CAUSE = Cause(CauseKind.RANK_FAILED, "node 2048, rank 16384 (local rank 0, pid 1234 on vm): RuntimeError: injected",
              node_index=2048, time=1.5)
PROGRESS = NodeProgress(ranks=8, step_min=10, step_median=12, step_max=14, rate=2.0, rate_min=1.0, slowest_rank=3,
                        rank_lo=0, rank_hi=7, stalled=0.5)
MESSAGES = {
    "hb": m.Heartbeat(), "hb_quiet": m.Heartbeat(quiet=1.25), "hb_progress": m.Heartbeat(quiet=1.25, progress=PROGRESS),
    "challenge": m.Challenge(b"\x01" * 32), "hello": m.Hello(17, b"\x02" * 32, "ab" * 32, host="vm", pid=12345),
    "welcome": m.Welcome("cd" * 32), "abort": m.Abort(CAUSE), "call": m.Call(3, "train.py"), "go": m.Go(3, 29500),
    "leave": m.Leave(3, True),
}


def timed(number: int, repeat: int) -> dict:
    def us(f) -> float:
        return round(min(timeit.Timer(f, timer=time.thread_time).repeat(number=number, repeat=repeat)) / number * 1e6, 2)

    out = {}
    for name, message in MESSAGES.items():
        data = message.to_wire()
        line = wire.encode(data)
        out[name] = {"to_wire": us(message.to_wire), "parse": us(lambda: m.parse(data)),
                     "to_line": us(lambda: wire.encode(message.to_wire())),
                     "from_line": us(lambda: m.parse(wire.decode(line)))}
    return out


if __name__ == "__main__":
    print(json.dumps(timed(int(sys.argv[1]) if len(sys.argv) > 1 else 2000, int(sys.argv[2]) if len(sys.argv) > 2 else 7)))
