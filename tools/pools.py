"""`make test` and `make test-fast`: the suite as two pytest runs at once, one verdict.

Most tests spend CPU (a real flow costs about 5 CPU-s); some mostly wait (the
gang's own timeouts, a save, a silence), and tests/conftest.py marks those
``waits``. On 2 cores, three workers keep the CPU busy with the first kind (a flow
waits for part of its life: at two, 13 % of the machine idled), but a
worker given a test that waits 50 s for 3 CPU-s idles a core. So each kind gets
its pool, run at the same time: the CPU-bound tests at ``--workers`` (3), the
wait-bound ones at ``--wait-workers`` (4). Together they run every test once:
``-m "not waits"`` and ``-m "waits"`` split the suite.

The CPU-bound pool prints as it goes; the wait-bound pool's output is kept in
RESULTS/waits.log and printed whole once both have ended (never interleaved).
Each writes a JUnit XML file there; the last lines sum both up. The exit status
is 0 only if both pools passed (a pool left empty by ``--select`` counts as
passed, unless both are).

    python tools/pools.py [--workers 3] [--wait-workers 4] [--select "not slow"] [-- PYTEST_ARGS]

``--workers 0``: one pytest, one process, in file order, no pools (to debug).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAITS = "waits"  # the marker tests/conftest.py gives wait-bound tests
NO_TESTS = 5  # pytest's exit status when the selection is empty
RESULTS = os.path.join(ROOT, "build", "test-results")  # the JUnit files, the wait-bound pool's log, the timeline
TIMELINE = "timeline"  # under RESULTS: <pool>/<worker>.tsv (tools/timeline.py reads it)


@dataclass(frozen=True)
class Pool:
    name: str
    marks: str  # the -m expression that selects this pool's tests
    workers: int
    paths: Tuple[str, ...] = ()  # the files its workers collect; () is all of tests/


def wait_files(conftest: str = os.path.join(ROOT, "tests", "conftest.py")) -> Tuple[str, ...]:
    """The files of the tests conftest.py's WAITS table marks, read from its source
    (importing it would import Metaflow). Every worker collects the files it is given,
    all of them: the wait-bound pool's four, given all of tests/, spent about 16 CPU-s (fresh clone)
    each collecting some 200 files (torch imported by a few) to keep 15."""
    with open(conftest) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "WAITS" for t in node.targets):
            return tuple(sorted({key.split("::")[0] for key in ast.literal_eval(node.value)}))
    raise SystemExit("%s has no WAITS table" % conftest)


@dataclass
class Outcome:
    pool: Pool
    status: int
    counts: dict = field(default_factory=dict)  # JUnit's: tests, failures, errors, skipped, time (s)
    failed: List[str] = field(default_factory=list)


def pools(workers: int, wait_workers: int, select: str = "") -> List[Pool]:
    """The two pools; ``select`` (a -m expression) narrows both."""
    def marks(own: str) -> str:
        return "(%s) and (%s)" % (select, own) if select else own
    return [Pool("cpu-bound", marks("not " + WAITS), workers),
            Pool("wait-bound", marks(WAITS), wait_workers, wait_files())]


def pytest_argv(marks: str, workers: int, junit: Optional[str], extra: Sequence[str],
                paths: Sequence[str] = ()) -> List[str]:
    """One pytest run over ``paths`` (the whole suite if none), or over the paths (and node ids) among ``extra``."""
    named = any(not a.startswith("-") and os.path.exists(os.path.join(ROOT, a.split("::")[0])) for a in extra)
    argv = [sys.executable, "-m", "pytest", *([] if named else list(paths) or ["tests"]), "-n", str(workers)]
    argv += ["-m", marks] if marks else []
    argv += ["--dist", "worksteal"] if workers else []
    argv += ["--junitxml", junit] if junit else []
    return argv + list(extra)


def pool_argv(pool: Pool, junit: str, timeline: str, extra: Sequence[str]) -> List[str]:
    """Each pool its own cache (one's --lf record must not overwrite the other's) and its own
    timeline folder, given as one word: a folder that exists, given apart, would read as a test path."""
    return pytest_argv(pool.marks, pool.workers, junit, ["-o", "cache_dir=.pytest_cache/" + pool.name,
                       "--timeline=" + os.path.join(timeline, pool.name), *extra], pool.paths)


def read_junit(path: str, root: str = ROOT) -> tuple:
    """(counts, failed tests) from pytest's JUnit XML; empty when it wrote none
    (pytest stopped before running anything: its own output says why)."""
    counts: dict = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "time": 0.0}
    failed: List[str] = []
    if not os.path.exists(path):
        return counts, failed
    tree = ET.parse(path).getroot()
    for suite in tree.iter("testsuite"):
        for key in counts:
            counts[key] += type(counts[key])(suite.get(key, 0))
    for case in tree.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(node_id(case.get("classname", ""), case.get("name", ""), root))
    return counts, failed


def node_id(classname: str, name: str, root: str = ROOT) -> str:
    """pytest's node id back from JUnit's dotted class name: the longest
    prefix that is a test file, then any class, then the test."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if os.path.exists(os.path.join(root, path)):
            return "::".join([path, *parts[cut:], name])
    return "%s::%s" % (classname, name)


def verdict(outcomes: Sequence[Outcome]) -> int:
    """0 when every pool passed; a pool that selected nothing passes unless all did."""
    statuses = [o.status for o in outcomes]
    if all(s == NO_TESTS for s in statuses):
        return NO_TESTS
    return 0 if all(s in (0, NO_TESTS) for s in statuses) else 1


def summary(outcomes: Sequence[Outcome]) -> List[str]:
    lines = []
    for o in outcomes:
        c = o.counts
        passed = c["tests"] - c["failures"] - c["errors"] - c["skipped"]
        said = "%d passed, %d failed, %d errors, %d skipped" % (passed, c["failures"], c["errors"], c["skipped"])
        if not c["tests"]:
            said = "no tests run"
        lines.append("%s pool (-m %r, %d workers): %s in %.0f s (pytest exit %d)"
                     % (o.pool.name, o.pool.marks, o.pool.workers, said, c["time"], o.status))
        lines.extend("  FAILED %s" % f for f in o.failed)
    lines.append("both pools passed" if verdict(outcomes) == 0 else "FAILED: see the pool(s) above")
    return lines


def cpu_times(stat: str = "/proc/stat") -> Optional[tuple]:
    """(busy, all) seconds of every CPU since boot, from the kernel's first line; None off Linux."""
    try:
        with open(stat) as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = sum(fields[3:5])  # idle, iowait
    ticks = os.sysconf("SC_CLK_TCK")
    return (sum(fields[:8]) - idle) / ticks, sum(fields[:8]) / ticks


def busy_line(before: Optional[tuple], after: Optional[tuple]) -> str:
    """How much of the machine the run used: a CPU-bound suite near 100 % gains nothing
    from more workers; one well below it waits, and gains from more (or from less waiting)."""
    if before is None or after is None or after[1] <= before[1]:
        return ""
    busy = after[0] - before[0]
    return "the machine's CPUs were busy %.0f %% of the run (%.0f CPU-s of %.0f)" % (
        100.0 * busy / (after[1] - before[1]), busy, after[1] - before[1])


def bytecode_cold(module: str = "metaflow") -> bool:
    """Whether the venv was never imported from: uv installs without compiling (tools/install.py),
    and Python writes a module's bytecode the first time it is imported. False where it would write none."""
    spec = importlib.util.find_spec(module)
    if sys.dont_write_bytecode or spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    return not os.path.exists(importlib.util.cache_from_source(spec.origin))


def warm_bytecode() -> None:
    """One collection before the pools, and torch's import beside it. Cold, every worker compiled
    the same modules at the same time (metaflow, torch, moto, the tests): a collection took 13.3
    CPU-s cold and 4.4 warm, and a fresh clone starts about nine processes that collect or import
    them at once. The collection imports no torch (a test file imports it in its tests, not at its
    top), so the two compile apart: 12.0 s one after the other, 6.8 s side by side, cold."""
    began = time.monotonic()
    torch = subprocess.Popen([sys.executable, "-c", "import torch, torch.distributed.run"], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
                       cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    finally:
        torch.wait()
    print("a fresh venv: what the suite imports compiled once, before the pools, in %.0f s"
          % (time.monotonic() - began), flush=True)


def run_pools(chosen: Sequence[Pool], results: str, extra: Sequence[str]) -> int:
    os.makedirs(results, exist_ok=True)
    started = cpu_times()
    if bytecode_cold():
        warm_bytecode()
    files = {name: os.path.join(results, name) for name in ("cpu.xml", "waits.xml", "waits.log")}
    for path in files.values():  # a pool that writes none must not be read as the last run's
        if os.path.exists(path):
            os.remove(path)
    live, quiet = chosen
    timeline = os.path.join(results, TIMELINE)
    for pool in chosen:  # each pool's workers write when each test ran (tests/conftest.py)
        shutil.rmtree(os.path.join(timeline, pool.name), ignore_errors=True)
        os.makedirs(os.path.join(timeline, pool.name))

    with open(files["waits.log"], "wb") as log:
        background = subprocess.Popen(pool_argv(quiet, files["waits.xml"], timeline, extra), cwd=ROOT, stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            first = subprocess.run(pool_argv(live, files["cpu.xml"], timeline, extra), cwd=ROOT)
            second = background.wait()
        finally:
            if background.poll() is None:  # Ctrl-C, or we failed: it must not outlive us
                background.terminate()
                background.wait()
    print("\n%s the %s pool's output (%s) %s" % ("=" * 30, quiet.name, files["waits.log"], "=" * 30), flush=True)
    with open(files["waits.log"], "rb") as f:
        sys.stdout.buffer.write(f.read())
    sys.stdout.flush()
    outcomes = [Outcome(live, first.returncode, *read_junit(files["cpu.xml"])),
                Outcome(quiet, second, *read_junit(files["waits.xml"]))]
    print("\n" + "\n".join(summary(outcomes) + [busy_line(started, cpu_times())]).rstrip(), flush=True)
    return verdict(outcomes)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=3, help="the CPU-bound pool's workers (0: no pools)")
    parser.add_argument("--wait-workers", type=int, default=4, help="the wait-bound pool's workers")
    parser.add_argument("--select", default="", help="a -m expression both pools keep to, e.g. 'not slow'")
    parser.add_argument("--results", default=RESULTS)
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to both pytest runs")
    args = parser.parse_args(argv)
    if "-m" in args.pytest_args or any(a.startswith("-m") and len(a) > 2 for a in args.pytest_args):
        parser.error("a -m among the pytest arguments would replace each pool's own: use --select")
    if args.workers == 0:
        return subprocess.run(pytest_argv(args.select, 0, None, args.pytest_args), cwd=ROOT).returncode
    return run_pools(pools(args.workers, args.wait_workers, args.select), args.results, args.pytest_args)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # both pytest runs had the Ctrl-C too, and have said so
        sys.exit(130)
