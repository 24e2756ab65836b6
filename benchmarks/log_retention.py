"""What pruning the per-rank logs costs at each call's start, on a host with many runs.

Lays out N runs' logs as @torchrun does (one step, one call, 2 nodes x 2 ranks:
4 log files, the agent's log and the lock per node), all within the retention age,
then times ``logs.prune_logs`` with the default policy: the first prune (no
ledger: every run is walked once), the next ones (nothing changed: one ``lstat``
per run and the ledger), and one after a run's new call (that run alone walked).
Medians of ``--repeat``; merged into benchmarks/results/log_retention.json by size.

    python benchmarks/log_retention.py [--runs 10000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import metaflow  # noqa: E402,F401  (first: the extension's modules import it)
from metaflow_extensions.torchrun.plugins.torchrun.host import logs  # noqa: E402

FILES = ("rank-0.stdout.log", "rank-0.stderr.log", "rank-1.stdout.log", "rank-1.stderr.log",
         "torchrun-agent.log", ".lock")


def lay_out(root: str, runs: int) -> None:
    now = time.time()
    for i in range(runs):
        run = os.path.join(root, "Flow%d-%d" % (i % 7, 1700000000 + i))
        for node in range(2):
            path = os.path.join(run, "train-2-0", "c0", "node-%d" % node)
            os.makedirs(path, mode=0o700)
            for name in FILES:
                with open(os.path.join(path, name), "wb") as f:
                    f.write(b"x" * 200)
        then = now - 3600 - i  # an hour old and older: past "young", within the age
        os.utime(run, (then, then))


def timed(root: str) -> float:
    began = time.perf_counter()
    removed = logs.prune_logs(root, logs.retention_policy())
    assert removed == [], removed  # all within the age: the scan is the whole cost
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="log-retention-")
    try:
        root = os.path.join(tmp, "logs")
        os.makedirs(root, mode=0o700)
        lay_out(root, args.runs)
        first: List[float] = []
        for _ in range(args.repeat):  # each without the ledger: every run walked
            try:
                os.unlink(os.path.join(root, logs.LEDGER_FILE))
            except FileNotFoundError:
                pass
            first.append(timed(root))
        steady = [timed(root) for _ in range(args.repeat)]
        changed = []
        names = sorted(n for n in os.listdir(root) if not n.startswith("."))
        for i in range(args.repeat):
            os.utime(os.path.join(root, names[i]))  # a new call of that run
            changed.append(timed(root))
        with os.popen("uptime") as f:
            load = f.read().strip()
        result: Dict[str, object] = {
            "runs": args.runs,
            "files_per_run": 2 * len(FILES),
            "first_prune_s": round(statistics.median(first), 4),
            "steady_prune_s": round(statistics.median(steady), 4),
            "one_run_changed_s": round(statistics.median(changed), 4),
            "repeat": args.repeat,
            "load": load,
        }
        print(json.dumps(result, indent=1))
        path = os.path.join(HERE, "results", "log_retention.json")
        try:
            with open(path) as f:
                merged = json.load(f)  # other sizes are kept
        except (OSError, ValueError):
            merged = {}
        merged[str(args.runs)] = result
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(merged, f, indent=1, sort_keys=True)
            f.write("\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
