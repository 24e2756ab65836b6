"""The benchmark suite of @torchrun, in one command (issue #8).

Every measurement compares A, the job under ``@torchrun``
(benchmarks/flows/torchrun_flow.py), with B, the same job launched by hand with
``python -m torch.distributed.run`` in a plain ``@parallel`` step
(benchmarks/flows/manual_flow.py). Runs are paired A then B, A then B...; each
pair gives a ratio A/B and the figure reported is the median of the ratios.

Sections (all by default, in this order; --only picks some):

  floor     python start-up, `import metaflow`, `import torch, torch.distributed`
            and the same flow with an empty train step (no job at all)
  overhead  the trivial job (init, barrier, exit), 2 nodes x 2 processes:
            whole `flow.py run` wall time; goal A/B <= 1.05
  logs      4 ranks (2 x 2) x --lines lines each: wall time, goal A/B <= 1.10,
            and every line present in the task's logs (read with the client)
  scaling   2 nodes x {1,2,4,8} processes and {2,4,8} nodes x 1 process: wall
            time, time to the first line of the last rank, CPU time and peak RSS
            of the launcher's own processes (not the ranks')
  failure   failure-detection latency (see failure_latency.py), with the
            hand-written baseline capped at --cap seconds

Results: <out>/<section>.json, <out>/summary.md and a plot (docs/benchmarks.png
for a full run into benchmarks/results). Run it with the project's venv first on
PATH and METAFLOW_USER set (the Makefile's `bench` target does both):

    python benchmarks/run.py            # the full suite (about 35 min on 2 cores)
    python benchmarks/run.py --quick    # a smoke test: every section, small sizes (~6 min)
    python benchmarks/run.py --only logs --pairs 3
    python benchmarks/run.py --report-only   # summary and plot from saved JSON
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import failure_latency  # noqa: E402
import report  # noqa: E402
from _lib import (  # noqa: E402
    DOCS,
    FLOW_NAMES,
    RESULTS,
    RunResult,
    Sandbox,
    launcher_usage,
    machine_info,
    median,
    paired,
    versions,
    write_json,
)

SECTIONS = ("floor", "overhead", "logs", "scaling", "failure")
SCALING_FULL = [(2, 1), (2, 2), (2, 4), (2, 8), (4, 1), (8, 1)]
SCALING_QUICK = [(2, 1), (2, 2), (4, 1)]
RUN_TIMEOUT = 900.0  # seconds for one `flow.py run`; the 8-node case is slow on 2 cores


def log(message: str) -> None:
    elapsed = time.monotonic() - START
    print("[%5.0fs] %s" % (elapsed, message), file=sys.stderr, flush=True)


START = time.monotonic()


TORCHRUN_ATTRS: Optional[str] = None  # --torchrun-attrs


def one_run(variant: str, params: Dict[str, object], run_args=(), sample: bool = False,
            check=None) -> RunResult:
    """One `flow.py run` in a fresh sandbox; ``check(box, result)`` may read the
    run's logs before the sandbox goes."""
    env = {"BENCH_TORCHRUN_ATTRS": TORCHRUN_ATTRS} if TORCHRUN_ATTRS and variant == "torchrun" else None
    with Sandbox() as box:
        result = box.run(variant, params, run_args, timeout=RUN_TIMEOUT, sample=sample, env=env)
        if result.ok() and check is not None:
            check(box, result)
        return result


# -- sections ---------------------------------------------------------------


def time_command(argv: List[str], repeat: int) -> Dict[str, object]:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        samples.append(time.perf_counter() - t0)
    return {"argv": argv, "samples_s": samples, "median_s": statistics.median(samples),
            "min_s": min(samples)}


def section_floor(args) -> Dict[str, object]:
    py = sys.executable
    out: Dict[str, object] = {}
    for name, code in (("python", "pass"), ("import_metaflow", "import metaflow"),
                       ("import_torch", "import torch, torch.distributed")):
        out[name] = time_command([py, "-c", code], args.floor_repeat)
        log("floor %s: median %.2f s" % (name, out[name]["median_s"]))
    params = {"script": "none", "nodes": 2, "nproc": 2}
    out["empty_flow"] = paired(
        args.pairs,
        lambda i: one_run("torchrun", params),
        lambda i: one_run("manual", params),
        {"wall_s": lambda r: r.wall_s},
        log=log, label="empty flow (2 nodes, no job)",
    )
    return out


def section_overhead(args) -> Dict[str, object]:
    params = {"script": "trivial.py", "nodes": 2, "nproc": 2}
    for i in range(args.warmup):
        for variant in ("torchrun", "manual"):
            r = one_run(variant, params)
            log("warm-up %s: %.2f s%s" % (variant, r.wall_s, "" if r.ok() else " (FAILED rc=%s)" % r.returncode))
    out = paired(
        args.pairs,
        lambda i: one_run("torchrun", params),
        lambda i: one_run("manual", params),
        {"wall_s": lambda r: r.wall_s, "first_line_s": first_line_of_last_rank(4)},
        log=log, label="overhead 2x2",
        extra=lambda r: {"phases": r.phases()},
    )
    out["phases"] = median_phases(out["pairs"])
    out.update({"nodes": 2, "nproc_per_node": 2, "goal_ratio": 1.05})
    return out


def median_phases(rows: List[dict]) -> Dict[str, Dict[str, Optional[float]]]:
    """Per variant, the median of each phase over the successful runs."""
    out: Dict[str, Dict[str, Optional[float]]] = {}
    for key, variant in (("a", "torchrun"), ("b", "manual")):
        runs = [r[key + "_extra"]["phases"] for r in rows if r.get(key + "_ok") and r.get(key + "_extra")]
        names = runs[0].keys() if runs else []
        out[variant] = {n: median([p.get(n) for p in runs]) for n in names}
    return out


def median_usage(rows: List[dict]) -> Dict[str, Dict[str, Dict[str, float]]]:
    """Per variant and kind of process: median count, CPU and summed peak RSS."""
    out: Dict[str, Dict[str, Dict[str, float]]] = {}
    for key, variant in (("a", "torchrun"), ("b", "manual")):
        runs = [r[key + "_extra"]["usage"] for r in rows if r.get(key + "_ok") and r.get(key + "_extra")]
        kinds = sorted({k for u in runs for k in u})
        out[variant] = {
            k: {f: median([u.get(k, {}).get(f, 0.0) for u in runs]) for f in ("count", "cpu_s", "rss_sum_mb")}
            for k in kinds
        }
    return out


def first_line_of_last_rank(world: int):
    def metric(r: RunResult) -> Optional[float]:
        times = r.ready_times()
        if len(times) < world:
            return None
        return max(times.values()) - r.started_at
    return metric


LOG_CHECK = r'''
import re
pat = re.compile(rb"BENCHLOG rank=(\d+) seq=(\d+) x{48} END")
lines = %(lines)d
seen = {}
dups = 0
where = {}
for task in Flow(%(flow)r)[%(run)r]["train"]:
    for stream in ("stdout", "stderr"):
        text = getattr(task, stream)
        text = text.encode() if isinstance(text, str) else text
        n = 0
        for m in pat.finditer(text):
            rank, seq = int(m.group(1)), int(m.group(2))
            marks = seen.setdefault(rank, bytearray(lines))
            if seq < lines:
                if marks[seq]:
                    dups += 1
                marks[seq] = 1
            n += 1
        if n:
            where["%%s/%%s" %% (task.id, stream)] = n
present = {str(r): sum(m) for r, m in seen.items()}
result = {"present": present, "duplicates": dups, "where": where,
          "complete": len(seen) == %(world)d and all(sum(m) == lines for m in seen.values())}
'''


def section_logs(args) -> Dict[str, object]:
    lines, world = args.lines, 4
    params = {"script": "logs.py", "script_args": ["--lines", str(lines)], "nodes": 2, "nproc": 2}
    # Metaflow keeps at most --max-log-size MB of a task's output (10 by default):
    # 400k lines need more, for both variants alike.
    run_args = ["--max-log-size", str(max(10, lines * world * 200 // (1024 * 1024) + 10))]
    checks: Dict[str, List[dict]] = {"torchrun": [], "manual": []}

    def check(box, r):
        try:
            found = box.client(LOG_CHECK % {"lines": lines, "flow": FLOW_NAMES[r.variant],
                                            "run": r.run_id, "world": world})
        except Exception as e:
            found = {"complete": False, "error": str(e)[-1000:]}
        checks[r.variant].append(found)
        if not found.get("complete"):
            log("  %s: lines missing in the task logs: %s" % (r.variant, found))

    out = paired(
        args.pairs,
        lambda i: one_run("torchrun", params, run_args, sample=True, check=check),
        lambda i: one_run("manual", params, run_args, sample=True, check=check),
        {"wall_s": lambda r: r.wall_s,
         "launcher_cpu_s": lambda r: launcher_usage(r.usage)["cpu_s"],
         "runtime_cpu_s": lambda r: r.usage.get("runtime", {}).get("cpu_s")},
        log=log, label="logs 4x%d" % lines,
        extra=lambda r: {"usage": r.usage, "phases": r.phases()},
    )
    out["phases"] = median_phases(out["pairs"])
    out["usage"] = median_usage(out["pairs"])
    out.update({
        "lines_per_rank": lines, "ranks": world, "nodes": 2, "nproc_per_node": 2,
        "max_log_size_mb": int(run_args[1]), "goal_ratio": 1.10, "checks": checks,
        "all_lines_present": {v: bool(c) and all(x.get("complete") for x in c) for v, c in checks.items()},
    })
    return out


def section_scaling(args) -> Dict[str, object]:
    configs = SCALING_QUICK if args.quick else SCALING_FULL
    if args.scaling:
        configs = [tuple(int(x) for x in c.split("x")) for c in args.scaling.split(",")]
    out: Dict[str, object] = {"configs": []}
    for nodes, nproc in configs:
        params = {"script": "trivial.py", "nodes": nodes, "nproc": nproc}
        res = paired(
            args.scaling_pairs or args.pairs,
            lambda i: one_run("torchrun", params, sample=True),
            lambda i: one_run("manual", params, sample=True),
            {"wall_s": lambda r: r.wall_s,
             "first_line_s": first_line_of_last_rank(nodes * nproc),
             "launcher_cpu_s": lambda r: launcher_usage(r.usage)["cpu_s"],
             "launcher_rss_mb": lambda r: launcher_usage(r.usage)["rss_sum_mb"],
             "launcher_rss_max_mb": lambda r: launcher_usage(r.usage)["rss_max_mb"]},
            log=log, label="scaling %dx%d" % (nodes, nproc),
            extra=lambda r: {"usage": r.usage, "phases": r.phases()},
        )
        res.update({"nodes": nodes, "nproc_per_node": nproc,
                    "phases": median_phases(res["pairs"]), "usage": median_usage(res["pairs"])})
        out["configs"].append(res)
    return out


def section_failure(args) -> Dict[str, object]:
    return failure_latency.measure(
        args.failure_repeat, args.heartbeat_timeout, args.cap, baseline=True, log=log)


# -- main ---------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1 pair, 10k lines, 3 scaling configs, 1 failure run each, cap 30 s")
    ap.add_argument("--pairs", type=int, default=None, help="A/B pairs per measurement (default 5; quick 1)")
    ap.add_argument("--scaling-pairs", type=int, default=None, help="pairs per scaling config (default: --pairs)")
    ap.add_argument("--lines", type=int, default=None, help="log lines per rank (default 100000; quick 10000)")
    ap.add_argument("--scaling", default=None, help="configs as NODESxNPROC,... (default: all six)")
    ap.add_argument("--failure-repeat", type=int, default=None, help="runs per failure kind (default 5; quick 1)")
    ap.add_argument("--heartbeat-timeout", type=float, default=10.0)
    ap.add_argument("--cap", type=float, default=None, help="failure cap in seconds (default 120; quick 30)")
    ap.add_argument("--warmup", type=int, default=None, help="unmeasured runs of each variant first (default 1; quick 0)")
    ap.add_argument("--floor-repeat", type=int, default=None)
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    ap.add_argument("--out", default=None, help="results directory (default benchmarks/results; quick: benchmarks/results/quick)")
    ap.add_argument("--plot", default=None, help="plot path (default docs/benchmarks.png; quick: <out>/benchmarks.png)")
    ap.add_argument("--report-only", action="store_true", help="only rebuild summary.md and the plot")
    ap.add_argument("--torchrun-attrs", default=None,
                    help='JSON @torchrun attributes for variant A, e.g. \'{"card": false}\' (not in failure)')
    args = ap.parse_args()
    global TORCHRUN_ATTRS
    TORCHRUN_ATTRS = args.torchrun_attrs
    q = args.quick
    args.pairs = args.pairs or (1 if q else 5)
    args.lines = args.lines or (10000 if q else 100000)
    args.failure_repeat = args.failure_repeat or (1 if q else 5)
    args.cap = args.cap or (30.0 if q else 120.0)
    args.warmup = args.warmup if args.warmup is not None else (0 if q else 1)
    args.floor_repeat = args.floor_repeat or (2 if q else 5)
    out_dir = args.out or (os.path.join(RESULTS, "quick") if q else RESULTS)
    plot = args.plot or (os.path.join(out_dir, "benchmarks.png") if q else os.path.join(DOCS, "benchmarks.png"))

    if not args.report_only:
        if not os.environ.get("METAFLOW_USER") and not os.environ.get("USER"):
            os.environ["METAFLOW_USER"] = "bench"
        venv_bin = os.path.dirname(sys.executable)
        if os.environ.get("PATH", "").split(os.pathsep)[0] != venv_bin:
            os.environ["PATH"] = venv_bin + os.pathsep + os.environ.get("PATH", "")
        sections = [s for s in args.only.split(",") if s]
        unknown = [s for s in sections if s not in SECTIONS]
        if unknown:
            ap.error("unknown section(s): %s" % ", ".join(unknown))
        meta = {
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": machine_info(),
            "versions": versions(),
            "args": vars(args),
            "sections": {},
        }
        started = time.monotonic()
        for name in SECTIONS:
            if name not in sections:
                continue
            log("== %s" % name)
            t0 = time.monotonic()
            data = globals()["section_" + name](args)
            took = time.monotonic() - t0
            data["duration_s"] = took
            data["date"] = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
            fname = "failure_latency.json" if name == "failure" else name + ".json"
            write_json(os.path.join(out_dir, fname), data)
            meta["sections"][name] = {"duration_s": took, "file": fname}
            log("== %s done in %.0f s" % (name, took))
        meta["duration_s"] = time.monotonic() - started
        meta_path = os.path.join(out_dir, "meta.json")
        if set(sections) != set(SECTIONS) and os.path.exists(meta_path):
            # A partial run: keep what the other sections' run recorded.
            import json

            with open(meta_path) as f:
                old = json.load(f)
            old_sections = old.get("sections", {})
            old_sections.update(meta["sections"])
            meta["sections"] = old_sections
        write_json(meta_path, meta)
        log("all done in %.0f s" % meta["duration_s"])
    summary = report.write_summary(out_dir)
    report.plot(out_dir, plot)
    print(summary)
    print("\nwrote %s and %s" % (os.path.join(out_dir, "summary.md"), plot))


if __name__ == "__main__":
    main()
