"""Failure-detection latency on this machine (2 nodes x 2 processes), for
@torchrun and for the same job launched by hand (benchmarks/flows/manual_flow.py).

For each failure we measure the time from the failure to the moment no torchrun
agent or rank of the gang is left (frozen: no such process of the *other* node is
left; the frozen node's own are killed when the step ends):

- rank_crash: a rank raises (the time it wrote just before raising);
- node_killed: node 1's Metaflow task is SIGKILLed (@torchrun only: by hand,
  nothing stops torchrun when its task dies, the gang runs on);
- node_frozen: node 1's task and everything below it get SIGSTOP.

Each measurement is capped (--cap): a gang still there after it counts as
"> cap" (the hand-written job waits for gloo's 30-minute timeout when a node
freezes). A capped hand-written case is not repeated: it would only cost the cap
again. Writes JSON (and prints a table).

    python benchmarks/failure_latency.py [--repeat 3] [--heartbeat-timeout 10] [--cap 120]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import sys
import time
from typing import Callable, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _lib import (  # noqa: E402
    RESULTS,
    Sandbox,
    alive,
    cmdline,
    descendants,
    is_gang_process,
    median,
    node_task,
    read_stat,
    write_json,
)

KINDS = ("rank_crash", "node_killed", "node_frozen")
BASELINE_KINDS = ("rank_crash", "node_frozen")
CRASH_RANK = 1


def goal_s(kind: str, heartbeat_timeout: float) -> float:
    return heartbeat_timeout + 5.0 if kind == "node_frozen" else 5.0


def _gang(root: int, exclude=()) -> List[tuple]:
    found = []
    for pid in descendants(root):
        if pid in exclude or not is_gang_process(cmdline(pid)):
            continue
        st = read_stat(pid)
        if st is not None and st[1] != b"Z":
            found.append((pid, st[3]))
    return found


def _wait_for(predicate: Callable[[], bool], timeout: float, proc=None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc is not None and proc.poll() is not None:
            return predicate()
        time.sleep(0.05)
    return False


def one(kind: str, variant: str, heartbeat_timeout: float, cap: float, log=print) -> Optional[float]:
    """Seconds from the failure until the (other nodes') gang is gone; None when
    it was still there after ``cap`` seconds."""
    with Sandbox() as box:
        env = {}
        if variant == "torchrun":
            env["BENCH_TORCHRUN_ATTRS"] = json.dumps({"heartbeat_timeout": heartbeat_timeout})
        rank = CRASH_RANK if kind == "rank_crash" else -1
        proc, console, _ = box.start(
            variant,
            {"script": "crash.py", "script_args": ["--rank", str(rank)], "nodes": 2, "nproc": 2},
            env=env,
        )
        try:
            ready = _wait_for(
                lambda: sum(n.startswith("ready-") for n in os.listdir(box.out)) >= 4, 300, proc
            )
            if not ready:
                raise RuntimeError("the gang never got ready:\n" + open(console, errors="replace").read()[-3000:])
            frozen = set()
            if kind == "rank_crash":
                path = os.path.join(box.out, "crash.json")
                watched = _gang(proc.pid)
                if not _wait_for(lambda: os.path.exists(path), 60, proc):
                    raise RuntimeError("no crash reported")
                with open(path) as f:
                    t0 = json.load(f)["time"]
            else:
                task = node_task(proc.pid, 1)
                if task is None:
                    raise RuntimeError("no task process for node 1")
                if kind == "node_killed":
                    watched = _gang(proc.pid)
                    t0 = time.time()
                    os.kill(task, signal.SIGKILL)
                else:
                    frozen = {task, *descendants(task)}
                    watched = _gang(proc.pid, exclude=frozen)
                    t0 = time.time()
                    for pid in frozen:
                        try:
                            os.kill(pid, signal.SIGSTOP)
                        except OSError:
                            pass
            left = list(watched)
            gone_at = None
            while time.time() - t0 < cap:
                left = [p for p in left if alive(p)]
                if not left:
                    gone_at = time.time()
                    break
                time.sleep(0.02)
            if gone_at is not None:
                try:
                    proc.wait(timeout=60)  # let the flow end on its own
                except Exception:
                    pass
            if variant == "torchrun":
                STACK_SECONDS.setdefault(kind, []).extend(stack_seconds(box.dir))
            return None if gone_at is None else gone_at - t0
        finally:
            box.kill_everything(proc)


# What collecting the ranks' stacks (and, on the control, waiting for the
# other nodes' stacks) added to each node's stop, per failure kind.
STACK_SECONDS: Dict[str, List[float]] = {}


def stack_seconds(sysroot: str) -> List[float]:
    """Each train task's ``stack_seconds`` from its result record, read from
    the local metadata files of the run."""
    found = []
    for path in glob.glob(os.path.join(sysroot, ".metaflow", "*", "*", "train", "*", "_meta",
                                       "sysmeta_torchrun-result_*.json")):
        try:
            with open(path) as f:
                record = json.loads(json.load(f)["value"])
            found.append(float(record.get("stack_seconds") or 0.0))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def measure(repeat: int, heartbeat_timeout: float, cap: float, baseline: bool = True,
            kinds=KINDS, log=print) -> Dict[str, object]:
    results: Dict[str, object] = {"heartbeat_timeout_s": heartbeat_timeout, "cap_s": cap,
                                  "nodes": 2, "nproc_per_node": 2}
    variants = [("torchrun", kinds)]
    if baseline:
        variants.append(("manual", [k for k in kinds if k in BASELINE_KINDS]))
    for variant, ks in variants:
        per_variant = {}
        for kind in ks:
            samples: List[Optional[float]] = []
            for i in range(repeat):
                try:
                    s = one(kind, variant, heartbeat_timeout, cap, log)
                    error = None
                except Exception as e:  # a broken run is reported, not fatal
                    s, error = None, str(e)[-500:]
                samples.append(s)
                log("  %s %s %d/%d: %s" % (variant, kind, i + 1, repeat,
                                          "error: " + error if error else
                                          "%.2f s" % s if s is not None else "> %g s (cap)" % cap))
                if s is None and variant == "manual" and error is None:
                    break  # it would only cost the cap again
            done = [s for s in samples if s is not None]
            per_variant[kind] = {
                "samples_s": samples,
                "median_s": median(done),
                "max_s": max(done) if done else None,
                "capped": sum(1 for s in samples if s is None),
                "goal_s": goal_s(kind, heartbeat_timeout),
            }
        results[variant] = per_variant
    results["stack_seconds"] = {kind: {"samples_s": v, "max_s": max(v) if v else None}
                                for kind, v in STACK_SECONDS.items()}
    # The layout of the first version of this file: @torchrun's figures at the top.
    for kind, value in results["torchrun"].items():  # type: ignore[union-attr]
        results[kind] = value
    return results


def table(results: Dict[str, object]) -> str:
    hb = results["heartbeat_timeout_s"]
    cap = results["cap_s"]
    rows = ["| failure | goal | @torchrun median | @torchrun worst | by hand median |", "|---|---|---|---|---|"]
    for kind in KINDS:
        t = (results.get("torchrun") or {}).get(kind)
        if t is None:
            continue
        m = (results.get("manual") or {}).get(kind)

        def f(v, capped=0):
            return "> %g s (cap)" % cap if v is None and capped else ("-" if v is None else "%.1f s" % v)

        manual = "not measured" if m is None else f(m["median_s"], m["capped"])
        if m is not None and m["capped"] and m["median_s"] is not None:
            manual += " (%d of %d runs > %g s)" % (m["capped"], len(m["samples_s"]), cap)
        rows.append("| %s | <= %g s | %s | %s | %s |" % (
            kind, goal_s(kind, hb), f(t["median_s"], t["capped"]), f(t["max_s"], t["capped"]), manual))
    stacks = results.get("stack_seconds") or {}
    if stacks:
        rows += ["", "| failure | what the ranks' stacks added to a node's stop: median | worst | goal |",
                 "|---|---|---|---|"]
        for kind, v in stacks.items():  # type: ignore[union-attr]
            samples = v["samples_s"]
            rows.append("| %s | %s | %s | <= 2 s |" % (
                kind, "%.2f s" % median(samples) if samples else "-", "%.2f s" % v["max_s"] if samples else "-"))
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--heartbeat-timeout", type=float, default=10.0)
    ap.add_argument("--cap", type=float, default=120.0, help="seconds; a gang still alive after it is '> cap'")
    ap.add_argument("--no-baseline", action="store_true", help="@torchrun only")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--out", default=os.path.join(RESULTS, "failure_latency.json"))
    args = ap.parse_args()
    results = measure(args.repeat, args.heartbeat_timeout, args.cap, not args.no_baseline,
                      [k for k in args.kinds.split(",") if k],
                      log=lambda m: print(m, file=sys.stderr, flush=True))
    write_json(args.out, results)
    print(table(results))


if __name__ == "__main__":
    main()
