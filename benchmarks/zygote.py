"""What a node process that keeps torch imported would save a restart (issue
37, part 3): the time from "start a rank" to its process group, for 2 ranks
(gloo, static store on loopback), started either fresh (``python script``, as
torchrun starts them) or forked from a process that imported torch before any
thread or CUDA use. Paired and interleaved (fresh, forked, fresh, ...);
medians, with the load average.

    python benchmarks/zygote.py [--pairs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

RANK = r'''
import os, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % os.environ["PORT"],
                        rank=int(os.environ["RANK"]), world_size=2)
os.write(1, ("GROUP %.6f\n" % time.time()).encode())  # one write: forked ranks share the pipe
dist.destroy_process_group()
'''


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fresh() -> float:
    p = str(port())
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, "-c", RANK], env=dict(os.environ, PORT=p, RANK=str(r)),
                              stdout=subprocess.PIPE, text=True) for r in range(2)]
    ends = [float(pr.communicate()[0].split()[1]) for pr in procs]
    return max(ends) - t0


def forked(server: subprocess.Popen) -> float:
    """The server has torch imported; it forks two ranks per request."""
    p = str(port())
    t0 = time.time()
    server.stdin.write(p + "\n")
    server.stdin.flush()
    ends = [float(server.stdout.readline().split()[1]) for _ in range(2)]
    return max(ends) - t0


SERVER = r'''
import os, sys, time
import torch  # kept imported; no thread, no CUDA before the fork
for line in sys.stdin:
    for r in range(2):
        if os.fork() == 0:
            os.environ.update(PORT=line.strip(), RANK=str(r))
            exec(compile(%r, "rank", "exec"))
            os._exit(0)
    for _ in range(2):
        os.wait()
''' % RANK


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--output", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "zygote.json"))
    args = ap.parse_args()
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    rows = []
    try:
        for i in range(args.pairs):
            a, b = fresh(), forked(server)
            rows.append({"fresh_s": round(a, 3), "forked_s": round(b, 3), "load": os.getloadavg()[0]})
            print(rows[-1], flush=True)
    finally:
        server.stdin.close()
        server.wait(timeout=30)
    out = {"what": "2 ranks: start -> init_process_group done (gloo, tcp:// on loopback)",
           "median_fresh_s": statistics.median(r["fresh_s"] for r in rows),
           "median_forked_s": statistics.median(r["forked_s"] for r in rows), "pairs": rows,
           "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    with open(args.output, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k != "pairs"}))


if __name__ == "__main__":
    main()
