"""The GPU check: what only a machine with an NVIDIA GPU can show.

    python benchmarks/gpu.py [--pairs 3] [--out DIR] [--python PY ...]    (or: make gpu-check)

Runs real Metaflow flows (benchmarks/gpu/gpu_flow.py) on this machine's GPUs, with
each interpreter given (``--python``, repeatable: another venv's torch; default this
one):

1. nproc_per_node derived from @resources(gpu=N) runs an NCCL all-reduce;
2. asking for more GPUs than the node has is refused, naming both numbers;
3. a CPU job (gloo, no GPU asked for) runs on the GPU machine, not refused;
4. a device-side assert in a rank fails the step with "CUDA error" in the root cause;
5. two nodes sharing one GPU end with an error, without hanging;
6. @torchrun(preflight="full") runs its collective job on NCCL before the call;
7. a rank that skips an all-reduce on NCCL (the others wait in it on the GPU, no
   collective on their stacks): the culprit named from NCCL's Flight Recorder; on
   torch 2.15 and later both with nccl2 (its default) and with TORCH_DIST_USE_NCCL2=0;
8. a rank SIGKILLed while the others are in collectives: the gang stopped in seconds;
9. on one GPU (benchmarks/gpu/nccl_recorder.py): a live rank whose group is NCCL (alone,
   and in a mixed cpu:gloo,cuda:nccl group) answers the node's question from NCCL's
   recorder, an all_reduce the GPU has not finished read as open; the warm process's
   fork guard refuses once CUDA is initialised; the arrival signal (gang/arrivals.py) on NCCL:
   with TORCH_NCCL_ENABLE_TIMING=1 each collective's start on the device (an all_reduce queued behind
   a GPU sleep read as late by the sleep), without it the host's enqueue time, and what the timing
   costs a short step;

(7 and 8 need two GPUs: on one they are reported as skipped), then measures, in
rounds of three runs of the same flow (@torchrun with its ranks forked from the warm
process, @torchrun with every rank started fresh, and the job by hand with torchrun
in the step): time from the train task's start to the first rank's first line, and
the median step time of 8-layer transformer DDP training in bf16. Needs metaflow and
a CUDA torch; CI never runs it. Results: JSON in --out, a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FLOW = os.path.join(HERE, "gpu", "gpu_flow.py")
RECORDER = os.path.join(HERE, "gpu", "nccl_recorder.py")
# The three ways the timing rounds start the same job.
MODES = {"warm": ("torchrun", {}), "fresh": ("torchrun", {"METAFLOW_TORCHRUN_WARM_START": "0"}),
         "hand": ("hand", {})}
STOP_SECONDS = 30.0  # "the gang stopped in seconds", after a rank is killed
PROBE = ("import json, torch, metaflow; print(json.dumps({'torch': torch.__version__, "
         "'gpus': torch.cuda.device_count(), 'name': torch.cuda.get_device_name(0) "
         "if torch.cuda.device_count() else ''}))")


def run_flow(sandbox: str, timeout: float, python: str = sys.executable, env_extra: Optional[Dict[str, str]] = None,
             **settings) -> dict:
    out = tempfile.mkdtemp(dir=sandbox)
    env = dict(os.environ)
    env.update({
        "METAFLOW_DATASTORE_SYSROOT_LOCAL": sandbox,
        "METAFLOW_USER": env.get("METAFLOW_USER", "gpu-check"),
        "PATH": os.path.dirname(python) + os.pathsep + env.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p),
        "GPUCHECK_OUT": out,
    })
    env.update({"GPUCHECK_" + k.upper(): str(v) for k, v in settings.items()})
    env.update(env_extra or {})
    started = time.monotonic()
    try:
        proc = subprocess.run([python, FLOW, "--no-pylint", "run"], cwd=sandbox, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        code, text = proc.returncode, (proc.stdout + proc.stderr).decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        code, text = None, ((e.stdout or b"") + (e.stderr or b"")).decode(errors="replace")
    return {"code": code, "text": text, "wall": time.monotonic() - started, "ended": time.time(), "out": out}


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
    """The failure's head as the product prints it: the "First failure: ..." line
    and the first exception line after it ("torch.AcceleratorError: CUDA error:
    ..."), joined; Metaflow's log prefixes cut."""
    lines = [line.split("] ", 1)[-1].strip() for line in text.splitlines()]
    heads = [i for i, line in enumerate(lines) if line.startswith(("First failure:", "torchrun on node"))]
    if not heads:
        return ""
    after = [line for line in lines[heads[0] + 1:] if re.match(r"^[\w.]+(Error|Exception)\b.*:", line)]
    return " / ".join([lines[heads[0]]] + after[:1])


def suspected(text: str) -> str:
    """The first "Suspected cause: ..." line, from those words on (Metaflow and
    @torchrun put their prefixes before them)."""
    lines = [line[line.index("Suspected cause:"):] for line in text.splitlines() if "Suspected cause:" in line]
    return lines[0] if lines else ""


def preflight_line(text: str) -> str:
    """``@torchrun: preflight: collective job (nccl) in 9.1s: all-reduce ok, ...``"""
    lines = [line.split("@torchrun: preflight: ", 1)[1] for line in text.splitlines()
             if "@torchrun: preflight: collective job" in line]
    return lines[0] if lines else ""


class Cases:
    """The cases of one interpreter, each a line of the report."""

    def __init__(self, sandbox: str, python: str, gpus: int):
        self.sandbox, self.python, self.gpus = sandbox, python, gpus
        self.results: List[dict] = []

    def run(self, timeout: float = 300, env_extra: Optional[Dict[str, str]] = None, **settings) -> dict:
        return run_flow(self.sandbox, timeout, self.python, env_extra, **settings)

    def check(self, name: str, ok: bool, run: dict, detail: str = "") -> None:
        self.results.append({"case": name, "ok": bool(ok), "wall_s": round(run["wall"], 1), "detail": detail})
        if not ok:
            sys.stderr.write("--- %s failed; output tail:\n%s\n" % (name, run["text"][-3000:]))

    def skip(self, name: str, why: str) -> None:
        self.results.append({"case": name, "ok": True, "skipped": why, "wall_s": 0.0, "detail": "skipped: " + why})


def basic_cases(c: Cases) -> None:
    gpus = c.gpus
    run = c.run(gpus=gpus, kind="allreduce")
    world = "world %d (nccl)" % gpus
    c.check("nproc derived from @resources(gpu=%d), NCCL all-reduce" % gpus,
            run["code"] == 0 and world in run["text"], run, world)
    run = c.run(gpus=gpus + 1, kind="allreduce")
    needle = "nproc_per_node=%d but this node has only %d visible CUDA device" % (gpus + 1, gpus)
    c.check("@resources(gpu=%d) on a %d-GPU node refused" % (gpus + 1, gpus),
            run["code"] not in (0, None) and needle in run["text"], run, needle)
    run = c.run(gpus=0, nproc=2, kind="cpu")
    c.check("CPU job (gloo, nproc_per_node=2, no GPU asked) on the GPU machine",
            run["code"] == 0 and "(gloo)" in run["text"], run)
    run = c.run(gpus=1, kind="assert")
    cause = root_cause(run["text"])
    c.check("device-side assert is the root cause", run["code"] not in (0, None) and "CUDA error" in cause,
            run, cause[:300])
    run = c.run(gpus=1, nodes=2, kind="allreduce")
    c.check("2 nodes sharing 1 GPU: an error, no hang", run["code"] not in (0, None), run,
            root_cause(run["text"])[:300])
    run = c.run(gpus=gpus, kind="allreduce", preflight="full")
    line = preflight_line(run["text"])
    c.check("preflight=\"full\" on NCCL: the collective job before the call", run["code"] == 0
            and "collective job (nccl)" in line and "all-reduce ok" in line, run, line[:300])


def failure_cases(c: Cases, torch_version: str) -> None:
    """A desync named from NCCL's own recorder, and a rank killed mid-collective."""
    flavours = [("NCCL", {})]
    if _at_least(torch_version, (2, 15)):
        flavours = [("nccl2, 2.15's default NCCL", {}), ("stock NCCL (TORCH_DIST_USE_NCCL2=0)",
                                                        {"TORCH_DIST_USE_NCCL2": "0"})]
    for label, env in flavours:
        name = "a rank skips an all-reduce on %s: the culprit from its Flight Recorder" % label
        if c.gpus < 2:
            c.skip(name, "needs 2 GPUs (NCCL refuses two ranks on one)")
            continue
        run = c.run(timeout=400, env_extra=env, gpus=2, kind="skip", hang_timeout=30)
        said = suspected(run["text"])
        c.check(name, run["code"] not in (0, None) and said.startswith("Suspected cause: rank 1 is not in the "
                                                                         "all_reduce")
                and "(from torch's Flight Recorder)" in said, run, said[:300])
    name = "a rank SIGKILLed mid-collective: the gang stopped within %d s" % STOP_SECONDS
    if c.gpus < 2:
        c.skip(name, "needs 2 GPUs")
        return
    run = c.run(gpus=2, kind="kill")
    killed = read(run["out"], "killed-at")
    took = run["ended"] - killed if killed else None
    c.check(name, run["code"] not in (0, None) and took is not None and took < STOP_SECONDS, run,
            "stopped %.1f s after the kill; %s" % (took if took is not None else -1, root_cause(run["text"])[:200]))


def recorder_cases(c: Cases) -> None:
    """NCCL's recorder read in a live rank and the fork guard, on one GPU."""
    with tempfile.NamedTemporaryFile(dir=c.sandbox, suffix=".json", delete=False) as f:
        out = f.name
    started = time.monotonic()
    try:
        proc = subprocess.run([c.python, RECORDER, out], capture_output=True, text=True, timeout=300)
        tail = (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired:
        tail = "timed out after 300 s"
    run = {"wall": time.monotonic() - started, "text": tail}
    try:
        with open(out) as f:
            found = json.load(f)
    except (OSError, ValueError):
        found = []
    if not found:
        c.check("NCCL recorder and fork guard on one GPU", False, run, tail[-300:])
    for case in found:
        c.check(case["case"], case["ok"], run, case["detail"])


def _at_least(version: str, wanted: tuple) -> bool:
    try:
        return tuple(int(p) for p in version.split("+")[0].split(".")[:2]) >= wanted
    except ValueError:
        return False


def timings(sandbox: str, python: str, pairs: int) -> dict:
    """``pairs`` rounds of warm, fresh and by hand, the order turned each round."""
    rows = []
    names = list(MODES)
    for i in range(pairs):
        row = {}
        for name in names[i % 3:] + names[:i % 3]:
            mode, env = MODES[name]
            run = run_flow(sandbox, 600, python, env, gpus=1, kind="train", mode=mode)
            if run["code"] != 0:
                sys.stderr.write("--- timing run (%s) failed:\n%s\n" % (name, run["text"][-3000:]))
            row[name] = {"first_line_s": first_line_after_start(run), "step_s": read(run["out"], "step-median"),
                         "wall_s": run["wall"]}
        rows.append(row)
        print("round %d: %s" % (i + 1, json.dumps(row)), flush=True)

    def med(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    summary = {key: {name: med([r[name][key] for r in rows]) for name in MODES}
               for key in ("first_line_s", "step_s", "wall_s")}
    for name in ("warm", "fresh"):
        summary["first_line_delta_s_" + name] = med(
            [r[name]["first_line_s"] - r["hand"]["first_line_s"] for r in rows
             if r[name]["first_line_s"] is not None and r["hand"]["first_line_s"] is not None])
        summary["step_ratio_" + name] = med([r[name]["step_s"] / r["hand"]["step_s"] for r in rows
                                             if r[name]["step_s"] and r["hand"]["step_s"]])
    return {"rounds": rows, "summary": summary}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="rounds of timing runs (warm, fresh, by hand)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--skip-timings", action="store_true")
    parser.add_argument("--python", action="append", default=[],
                        help="an interpreter whose torch runs the cases (repeatable; default: this one)")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    return args


def probe(python: str) -> dict:
    """What ``python`` has: its torch, its GPUs (CUDA's count: seconds on a GPU node),
    metaflow importable; ``problem`` says what is missing."""
    try:
        proc = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=180)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"problem": "%s could not be run: %s" % (python, e)}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"problem": "%s cannot import torch and metaflow: %s" % (python, last)}
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    if found["gpus"] < 1:
        found["problem"] = ("the GPU check needs at least one CUDA device; %s (torch %s) sees none"
                            % (python, found["torch"]))
    return found


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    pythons = args.python or [sys.executable]
    found = {python: probe(python) for python in pythons}
    problems = [f["problem"] for f in found.values() if "problem" in f]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    reports = []
    with tempfile.TemporaryDirectory(prefix="mftr-gpu-check-") as sandbox:
        for python in pythons:
            reports.append(check_one(sandbox, python, found[python], args))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu.json"), "w") as f:
        json.dump(reports[0] if len(reports) == 1 else {"interpreters": reports}, f, indent=1)
    for report in reports:
        show(report)
    return 0 if all(c["ok"] for r in reports for c in r["cases"]) else 1


def check_one(sandbox: str, python: str, found: dict, args: argparse.Namespace) -> dict:
    c = Cases(sandbox, python, found["gpus"])
    basic_cases(c)
    failure_cases(c, found["torch"])
    recorder_cases(c)
    report = {"date": time.strftime("%Y-%m-%d"), "python": python, "machine": "%s x%d" % (found["name"], found["gpus"]),
              "torch": found["torch"], "cases": c.results}
    if not args.skip_timings:
        report["timings"] = timings(sandbox, python, args.pairs)
    return report


def show(report: dict) -> None:
    print("%s, torch %s (%s)" % (report["machine"], report["torch"], report["python"]))
    for case in report["cases"]:
        mark = "skip" if case.get("skipped") else "ok" if case["ok"] else "FAIL"
        print("%-4s %-78s %6.1f s  %s" % (mark, case["case"], case["wall_s"], case["detail"][:120]))
    if "timings" in report:
        s = report["timings"]["summary"]
        for name in ("warm", "fresh"):
            print("%s ranks: first rank line after task start %s s (by hand %s s, median delta %s s); "
                  "median step %s ms (by hand %s ms, ratio %s)"
                  % (name, _f(s["first_line_s"][name]), _f(s["first_line_s"]["hand"]),
                     _f(s["first_line_delta_s_" + name]), _f(s["step_s"][name], 1000),
                     _f(s["step_s"]["hand"], 1000), _f(s["step_ratio_" + name], 1, 4)))


def _f(value, scale=1.0, digits=2):
    return "n/a" if value is None else ("%." + str(digits) + "f") % (value * scale)


if __name__ == "__main__":
    sys.exit(main())
