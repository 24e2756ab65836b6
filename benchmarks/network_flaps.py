"""How often a network flap shorter than heartbeat_timeout is ridden out: runs
one multi-host test (tests/multihost/test_network_faults.py, network
namespaces: needs root and iproute2) ``--repeat`` times in a row and counts
the runs that finished, with gloo's stalls of each (its ``FIGURES`` line).

A flap's cost is TCP's: a segment lost in the cut is resent 0.2, 0.6, 1.4,
3.0, 6.2, 12.6 s after it was first sent (later under load), so a 5 s cut can
read as 6 to 8 s of silence on a connection (docs/failures.md, "When the
network fails"). Writes JSON (and prints one line a run).

    python benchmarks/network_flaps.py [--repeat 20] [--test test_flaps_are_ridden_out] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = "tests/multihost/test_network_faults.py"


def one(test: str, timeout: float) -> dict:
    began = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "%s::%s" % (TESTS, test), "-p", "no:xdist", "-q",
                               "-x", "-s", "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = str(e.stdout or ""), -1
    figures = re.findall(r"^FIGURES [^:]*: (.*)$", out, re.M)
    said = re.findall(r"node \d stopped: (.*)", out)
    return {"ok": rc == 0, "rc": rc, "seconds": round(time.monotonic() - began, 1),
            "figures": json.loads(figures[-1]) if figures else None, "stopped": said[:2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--test", default="test_flaps_are_ridden_out")
    parser.add_argument("--timeout", type=float, default=400.0)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "network_flaps.json"))
    args = parser.parse_args()
    runs = []
    for i in range(args.repeat):
        run = one(args.test, args.timeout)
        runs.append(run)
        print("%2d %s %5.1fs %s %s" % (i + 1, "ok    " if run["ok"] else "FAILED", run["seconds"],
                                       json.dumps(run["figures"]), "; ".join(run["stopped"])), flush=True)
    result = {"test": args.test, "runs": runs, "finished": sum(r["ok"] for r in runs), "of": len(runs),
              "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d")}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("%d of %d finished" % (result["finished"], result["of"]))


if __name__ == "__main__":
    main()
