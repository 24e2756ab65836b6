"""The GPU check: what only a machine with an NVIDIA GPU can show.

    python benchmarks/gpu.py [--pairs 3] [--out DIR]      (or: make gpu-check)

Runs real Metaflow flows (benchmarks/gpu/gpu_flow.py) on this machine's GPUs:

1. nproc_per_node derived from @resources(gpu=N) runs an NCCL all-reduce;
2. asking for more GPUs than the node has is refused, naming both numbers;
3. a CPU job (gloo, no GPU asked for) runs on the GPU machine, not refused;
4. a device-side assert in a rank fails the step with "CUDA error" in the root cause;
5. two nodes sharing one GPU end with an error, without hanging;
6. @torchrun(preflight="full") runs its collective job on NCCL before the call:
   all-reduce, bus bandwidth, process-group init time (the line is reported);

then measures, in pairs (@torchrun, the same job by hand with torchrun in the same
flow): time from the train task's start to the first rank's first line, and the
median step time of 8-layer transformer DDP training in bf16. Needs metaflow and
a CUDA torch; CI never runs it. Results: JSON in --out, a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FLOW = os.path.join(HERE, "gpu", "gpu_flow.py")


def run_flow(sandbox: str, timeout: float, **settings) -> dict:
    out = tempfile.mkdtemp(dir=sandbox)
    env = dict(os.environ)
    env.update({
        "METAFLOW_DATASTORE_SYSROOT_LOCAL": sandbox,
        "METAFLOW_USER": env.get("METAFLOW_USER", "gpu-check"),
        "PATH": os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p),
        "GPUCHECK_OUT": out,
    })
    env.update({"GPUCHECK_" + k.upper(): str(v) for k, v in settings.items()})
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, FLOW, "--no-pylint", "run"], cwd=sandbox, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        code, text = proc.returncode, (proc.stdout + proc.stderr).decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        code, text = None, ((e.stdout or b"") + (e.stderr or b"")).decode(errors="replace")
    return {"code": code, "text": text, "wall": time.monotonic() - started, "out": out}


def read(out: str, name: str):
    try:
        with open(os.path.join(out, name)) as f:
            return float(f.read())
    except (OSError, ValueError):
        return None


def first_line_after_start(run: dict):
    start = read(run["out"], "task-start")
    firsts = [read(run["out"], n) for n in os.listdir(run["out"]) if n.startswith("first-line-")]
    firsts = [f for f in firsts if f is not None]
    return (min(firsts) - start) if start and firsts else None


def root_cause(text: str) -> str:
    lines = [line for line in text.splitlines() if "Root cause:" in line]
    return lines[0] if lines else ""


def preflight_line(text: str) -> str:
    """``@torchrun: preflight: collective job (nccl) in 9.1s: all-reduce ok, ...``"""
    lines = [line.split("@torchrun: preflight: ", 1)[1] for line in text.splitlines()
             if "@torchrun: preflight: collective job" in line]
    return lines[0] if lines else ""


def cases(sandbox: str, gpus: int) -> list:
    results = []

    def check(name, ok, run, detail=""):
        results.append({"case": name, "ok": bool(ok), "wall_s": round(run["wall"], 1), "detail": detail})
        if not ok:
            sys.stderr.write("--- %s failed; output tail:\n%s\n" % (name, run["text"][-3000:]))

    run = run_flow(sandbox, 300, gpus=gpus, kind="allreduce")
    world = "world %d (nccl)" % gpus
    check("nproc derived from @resources(gpu=%d), NCCL all-reduce" % gpus,
          run["code"] == 0 and world in run["text"], run, world)
    run = run_flow(sandbox, 300, gpus=gpus + 1, kind="allreduce")
    needle = "nproc_per_node=%d but this node has only %d visible CUDA device" % (gpus + 1, gpus)
    check("@resources(gpu=%d) on a %d-GPU node refused" % (gpus + 1, gpus),
          run["code"] not in (0, None) and needle in run["text"], run, needle)
    run = run_flow(sandbox, 300, gpus=0, nproc=2, kind="cpu")
    check("CPU job (gloo, nproc_per_node=2, no GPU asked) on the GPU machine",
          run["code"] == 0 and "(gloo)" in run["text"], run)
    run = run_flow(sandbox, 300, gpus=1, kind="assert")
    cause = root_cause(run["text"])
    check("device-side assert is the root cause", run["code"] not in (0, None) and "CUDA error" in cause,
          run, cause[:300])
    run = run_flow(sandbox, 300, gpus=1, nodes=2, kind="allreduce")
    check("2 nodes sharing 1 GPU: an error, no hang", run["code"] not in (0, None), run,
          root_cause(run["text"])[:300])
    run = run_flow(sandbox, 300, gpus=gpus, kind="allreduce", preflight="full")
    line = preflight_line(run["text"])
    check("preflight=\"full\" on NCCL: the collective job before the call", run["code"] == 0
          and "collective job (nccl)" in line and "all-reduce ok" in line, run, line[:300])
    return results


def timings(sandbox: str, pairs: int) -> dict:
    rows = []
    for i in range(pairs):
        pair = {}
        for mode in (("torchrun", "hand") if i % 2 == 0 else ("hand", "torchrun")):
            run = run_flow(sandbox, 600, gpus=1, kind="train", mode=mode)
            if run["code"] != 0:
                sys.stderr.write("--- timing run (%s) failed:\n%s\n" % (mode, run["text"][-3000:]))
            pair[mode] = {"first_line_s": first_line_after_start(run),
                          "step_s": read(run["out"], "step-median"), "wall_s": run["wall"]}
        rows.append(pair)
        print("pair %d: %s" % (i + 1, json.dumps(pair)), flush=True)

    def med(mode, key):
        values = [r[mode][key] for r in rows if r[mode][key] is not None]
        return statistics.median(values) if values else None

    summary = {key: {mode: med(mode, key) for mode in ("torchrun", "hand")}
               for key in ("first_line_s", "step_s", "wall_s")}
    deltas = [r["torchrun"]["first_line_s"] - r["hand"]["first_line_s"] for r in rows
              if r["torchrun"]["first_line_s"] is not None and r["hand"]["first_line_s"] is not None]
    ratios = [r["torchrun"]["step_s"] / r["hand"]["step_s"] for r in rows
              if r["torchrun"]["step_s"] and r["hand"]["step_s"]]
    summary["first_line_delta_s"] = statistics.median(deltas) if deltas else None
    summary["step_ratio"] = statistics.median(ratios) if ratios else None
    return {"pairs": rows, "summary": summary}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--skip-timings", action="store_true")
    args = parser.parse_args()
    import torch

    gpus = torch.cuda.device_count()
    if gpus < 1:
        print("the GPU check needs at least one CUDA device; this machine has none", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="mftr-gpu-check-") as sandbox:
        report = {
            "date": time.strftime("%Y-%m-%d"),
            "machine": torch.cuda.get_device_name(0) + " x%d" % gpus,
            "torch": torch.__version__,
            "cases": cases(sandbox, gpus),
        }
        if not args.skip_timings:
            report["timings"] = timings(sandbox, args.pairs)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu.json"), "w") as f:
        json.dump(report, f, indent=1)
    for case in report["cases"]:
        print("%-4s %-70s %6.1f s  %s" % ("ok" if case["ok"] else "FAIL", case["case"], case["wall_s"],
                                          case["detail"][:120]))
    if "timings" in report:
        s = report["timings"]["summary"]
        print("first rank line after task start: @torchrun %s s, by hand %s s (median delta %s s)"
              % (_f(s["first_line_s"]["torchrun"]), _f(s["first_line_s"]["hand"]), _f(s["first_line_delta_s"])))
        print("median step: @torchrun %s ms, by hand %s ms (ratio %s)"
              % (_f(s["step_s"]["torchrun"], 1000), _f(s["step_s"]["hand"], 1000), _f(s["step_ratio"], 1, 4)))
    return 0 if all(c["ok"] for c in report["cases"]) else 1


def _f(value, scale=1.0, digits=2):
    return "n/a" if value is None else ("%." + str(digits) + "f") % (value * scale)


if __name__ == "__main__":
    sys.exit(main())
