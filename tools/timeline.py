"""What `make test`'s pools did when: read the timeline its workers wrote (tests/conftest.py's
``--timeline``, given by tools/pools.py into build/test-results/timeline/<pool>/<worker>.tsv).

A suite that is CPU-bound should keep every core busy to its last second. Where it does not,
the reason is in when the long tests ran: one that waits 60 s, started last, is a 60 s tail
in which one core idles. This prints, for each pool, when it began and ended and how busy its
workers were; the tests still running in the last ``--tail`` seconds of the run; and the
longest tests with the time each began.

    python tools/timeline.py [build/test-results/timeline] [--tail 60] [--longest 15]
    python tools/timeline.py --write tests/durations.json   # what tests/conftest.py deals by

``--write``: each test of a second or more and its seconds, for tests/conftest.py to deal the long
files evenly among the workers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from pools import RESULTS, TIMELINE  # run as tools/timeline.py: tools/ is on the path


@dataclass(frozen=True)
class Ran:
    pool: str
    worker: str
    began: float
    ended: float
    test: str
    cpu: float = 0.0  # the worker's CPU seconds and its reaped children's; 0 in a timeline without them

    @property
    def seconds(self) -> float:
        return self.ended - self.began


def parse(pool: str, worker: str, text: str) -> List[Ran]:
    """A worker's lines; a line cut short (the worker killed mid-write) is left out."""
    out = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) not in (3, 4):
            continue
        try:
            cpu = float(parts[3]) if len(parts) == 4 else 0.0
            out.append(Ran(pool, worker, float(parts[0]), float(parts[1]), parts[2], cpu))
        except ValueError:
            continue
    return out


def read(folder: str) -> List[Ran]:
    runs: List[Ran] = []
    for pool in sorted(os.listdir(folder)):
        path = os.path.join(folder, pool)
        if not os.path.isdir(path):
            continue
        for name in sorted(os.listdir(path)):
            if name.endswith(".tsv"):
                with open(os.path.join(path, name)) as f:
                    runs.extend(parse(pool, name[:-4], f.read()))
    return runs


def report(runs: Sequence[Ran], tail: float = 60.0, longest: int = 15) -> List[str]:
    if not runs:
        return ["no timeline: run the suite with tools/pools.py (make test) first"]
    start, end = min(r.began for r in runs), max(r.ended for r in runs)
    lines = ["%d tests from %.0f s to %.0f s (times from the first test's start)" % (len(runs), 0, end - start)]
    pools: Dict[str, List[Ran]] = {}
    for r in runs:
        pools.setdefault(r.pool, []).append(r)
    for pool, own in sorted(pools.items()):
        workers = sorted({r.worker for r in own})
        busy = sum(r.seconds for r in own)
        last = max(r.ended for r in own) - start
        lines.append("%s: %d tests, %d workers, its last test ended at %.0f s; its workers ran tests %.0f %% of that"
                     % (pool, len(own), len(workers), last, 100.0 * busy / max(1e-9, last * len(workers))))
    lines.extend(busy_workers(runs, start, end, sorted(pools)))
    lines.append("running in the last %.0f s (%.0f s on), a second or more:" % (tail, end - start - tail))
    for r in sorted((r for r in runs if r.ended > end - tail and r.seconds >= 1.0), key=lambda r: r.began):
        lines.append("  %6.0f -> %6.0f s  %-10s %s" % (r.began - start, r.ended - start, r.pool, r.test))
    lines.append("the %d longest:" % longest)
    for r in sorted(runs, key=lambda r: -r.seconds)[:longest]:
        lines.append("  %5.1f s from %6.0f s  %-10s %s" % (r.seconds, r.began - start, r.pool, r.test))
    lines.extend(costliest(runs, longest))
    return lines


def costliest(runs: Sequence[Ran], most: int) -> List[str]:
    """The files that cost the most CPU: on 2 cores a CPU-bound suite lasts about its CPU over 2."""
    files: Dict[str, float] = {}
    for r in runs:
        name = r.test.split("::")[0]
        files[name] = files.get(name, 0.0) + r.cpu
    total = sum(files.values())
    if not total:
        return []
    lines = ["CPU: %.0f s in all; the %d files that cost the most:" % (total, most)]
    for name, cpu in sorted(files.items(), key=lambda kv: -kv[1])[:most]:
        lines.append("  %6.1f s  %4.1f %%  %s" % (cpu, 100.0 * cpu / total, name))
    return lines


def busy_workers(runs: Sequence[Ran], start: float, end: float, pools: Sequence[str], step: float = 30.0) -> List[str]:
    """How many of each pool's workers ran a test, on average, in each ``step`` seconds."""
    lines = ["workers running a test, on average, each %.0f s: %s" % (step, " | ".join(pools))]
    at = start
    while at < end:
        busy = []
        for pool in pools:
            seconds = sum(max(0.0, min(r.ended, at + step) - max(r.began, at)) for r in runs if r.pool == pool)
            busy.append("%4.1f" % (seconds / step))
        lines.append("  %5.0f s  %s" % (at - start, " | ".join(busy)))
        at += step
    return lines


def durations(runs: Sequence[Ran], least: float = 1.0) -> Dict[str, float]:
    """Each test of ``least`` seconds or more, by node id, in tenths: small enough to keep in git."""
    return {r.test: round(r.seconds, 1) for r in sorted(runs, key=lambda r: r.test) if r.seconds >= least}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", default=os.path.join(RESULTS, TIMELINE))
    parser.add_argument("--tail", type=float, default=60.0, help="seconds before the last test's end")
    parser.add_argument("--longest", type=int, default=15)
    parser.add_argument("--write", metavar="JSON", help="write each test's seconds (a second or more) there")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.folder):
        print("no timeline at %s: run the suite with tools/pools.py (make test) first" % args.folder, file=sys.stderr)
        return 1
    runs = read(args.folder)
    if args.write:
        seconds = durations(runs)
        with open(args.write, "w") as f:
            json.dump(seconds, f, indent=0, sort_keys=True)
            f.write("\n")
        print("%s: %d tests of a second or more" % (args.write, len(seconds)))
        return 0
    print("\n".join(report(runs, args.tail, args.longest)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
