"""The GPU check's one-GPU cases: NCCL's Flight Recorder read in a live rank, and
the warm process's fork guard with CUDA really initialised.

    python benchmarks/gpu/nccl_recorder.py OUT.json

Why this exists beside the flows of gpu.py: the desync culprit needs two ranks on
NCCL, and NCCL refuses two ranks on one GPU. What a single GPU can still show is
the half that only a GPU can: that a rank whose default group is NCCL answers the
node's question (procs/flight_ask.py, the FIFO the product uses) with NCCL's
recorder, its entries as torch writes them, and an NCCL collective that the GPU
has not finished read as open. The collective is held open by a GPU sleep queued
before it (``torch.cuda._sleep``): NCCL's stream waits behind it, so the entry
stays "started, not completed" for seconds, as in a hang. Each variant runs in its
own world-size-1 process: stock NCCL, and a mixed ``cpu:gloo,cuda:nccl`` group
(whose training collectives are NCCL's). Needs no metaflow; CI never runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from metaflow_extensions.torchrun.plugins.torchrun.procs import flight_ask  # noqa: E402
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import FR_BUFFER_ENV, FR_BUFFER_OLD_ENV  # noqa: E402

HOLD_SECONDS = 12  # how long the GPU sleep keeps the sixth all_reduce open

RANK = textwrap.dedent(
    """
    import datetime, os, sys
    sys.path.insert(0, sys.argv[3])
    from metaflow_extensions.torchrun.plugins.torchrun.procs import flight_ask
    work, backend, hold = sys.argv[1], sys.argv[2], float(sys.argv[4])
    flight_ask.listen(work, 0)
    import torch, torch.distributed as dist
    torch.cuda.set_device(0)
    dist.init_process_group(backend, init_method="file://" + os.path.join(work, "store"), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=120))
    t = torch.ones(1 << 20, device="cuda")
    for _ in range(5):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    print("five", flush=True)
    sys.stdin.readline()
    rate = torch.cuda.get_device_properties(0).clock_rate if hasattr(torch.cuda.get_device_properties(0),
                                                                     "clock_rate") else 0
    cycles = int(hold * (rate * 1000 if rate else 2.0e9))
    torch.cuda._sleep(cycles)                # the GPU busy for about `hold` seconds
    dist.all_reduce(t, async_op=True)        # queued behind it: started by us, not finished on the GPU
    print("held", flush=True)
    sys.stdin.readline()
    torch.cuda.synchronize()
    print("done", flush=True)
    sys.stdin.readline()
    dist.destroy_process_group()
    """
)

FORK_GUARD = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from metaflow_extensions.torchrun.plugins.torchrun.procs.fork_guard import ForkGuard
    guard = ForkGuard()
    import torch
    guard.warmed()
    said = {"after_import": guard.hazard(sys.modules)}
    torch.zeros(1, device="cuda")            # a user's import hook that touched the GPU
    said["after_cuda"] = guard.hazard(sys.modules)
    print(json.dumps(said))
    """
)


def ask(work: str) -> dict:
    asked = flight_ask.ask(work, [0])
    got = asked.answers(time.monotonic() + 20).get(0)
    return got.to_wire() if got is not None else {"state": "no answer"}


def group0(answer: dict):
    groups = answer.get("groups") or []
    return groups[0] if groups else None


def recorder_case(backend: str) -> List[dict]:
    """Three reads of one rank: after five finished all_reduces, with a sixth
    held open by the GPU, and after it finished."""
    results = []
    with tempfile.TemporaryDirectory(prefix="mftr-nccl-fr-") as work:
        script = os.path.join(work, "rank.py")
        with open(script, "w") as f:
            f.write(RANK)
        env = dict(os.environ, **{FR_BUFFER_ENV: "20", FR_BUFFER_OLD_ENV: "20"})
        proc = subprocess.Popen([sys.executable, script, work, backend, REPO, str(HOLD_SECONDS)], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            for said, step, want in (("five", "after 5 all_reduces", (5, True)),
                                     ("held", "a 6th held open by the GPU", (6, False)),
                                     ("done", "the 6th finished", (6, True))):
                line = proc.stdout.readline().strip()
                if line != said:
                    results.append({"case": "%s: %s" % (backend, step), "ok": False,
                                    "detail": "rank said %r; stderr: %s" % (line, proc.stderr.read()[-1500:])})
                    return results
                answer = ask(work)
                if want[1]:  # NCCL's watchdog marks completion a moment after the GPU's event
                    deadline = time.monotonic() + 10
                    while not (group0(answer) or {}).get("done") and time.monotonic() < deadline:
                        time.sleep(0.2)
                        answer = ask(work)
                g = group0(answer) or {}
                ok = (answer.get("state") == "ok" and str(answer.get("recorder", "")).startswith("nccl")
                      and (g.get("entered"), g.get("done"), g.get("op")) == (want[0], want[1], "all_reduce"))
                results.append({"case": "%s: %s" % (backend, step), "ok": ok, "detail": json.dumps(answer)[:400]})
                proc.stdin.write("\n")
                proc.stdin.flush()
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


ARRIVALS = textwrap.dedent(
    """
    import datetime, json, os, statistics, sys, tempfile, time
    sys.path.insert(0, sys.argv[1])
    from metaflow_extensions.torchrun.plugins.torchrun.procs import arrivals, flight_ask
    import torch, torch.distributed as dist
    import torch._C._distributed_c10d as c10d
    hold = float(sys.argv[2])
    torch.cuda.set_device(0)
    work = tempfile.mkdtemp()
    dist.init_process_group("nccl", init_method="file://" + os.path.join(work, "store"), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=120))
    t = torch.ones(1 << 20, device="cuda")
    for _ in range(5):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    props = torch.cuda.get_device_properties(0)
    rate = getattr(props, "clock_rate", 0)
    torch.cuda._sleep(int(hold * (rate * 1000 if rate else 2.0e9)))  # the GPU busy: a slow device, as it were
    dist.all_reduce(t)  # enqueued at once by the host, begun on the device after the sleep
    torch.cuda.synchronize()
    time.sleep(0.5)  # the watchdog finds it ended (it polls)
    recorder = flight_ask.recorder_for(flight_ask.default_backends(dist))
    text, why = flight_ask.dump_recorder(c10d, recorder)
    entries = json.loads(text).get("entries") if text is not None else []
    host = [a[1:] for a in map(arrivals.arrival, entries) if a is not None]
    device = [(e.get("collective_seq_id"), arrivals.device_ns(e), e.get("time_created_ns"), e.get("duration_ms"))
              for e in entries]
    watch = arrivals.ArrivalWatch(work, 0)
    watch.take(text, {"0": 2}, 1.0)  # a group of two, as if: the pairs it would write
    # What the timing costs: a short step (a matmul and an all-reduce) with timing on, as this process runs.
    a = torch.randn(2048, 2048, device="cuda")
    small = torch.ones(1 << 16, device="cuda")
    for _ in range(20):
        (a @ a).sum()
        dist.all_reduce(small)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(400):
        (a @ a).sum()
        dist.all_reduce(small)
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t0) * 1000.0 / 400
    print(json.dumps({"recorder": recorder, "why": why, "host": host, "device": device, "clock": watch.clock,
                      "pairs": sorted(watch.pairs.get("0", [])), "step_ms": step_ms, "hold_s": hold}))
    dist.destroy_process_group()
    """
)

HOLD = 0.5  # s: the GPU sleep before the sixth all_reduce


def _arrivals_run(timing: bool) -> dict:
    env = dict(os.environ, **{FR_BUFFER_ENV: "2000", FR_BUFFER_OLD_ENV: "2000"})
    env["TORCH_NCCL_ENABLE_TIMING"] = "1" if timing else "0"
    proc = subprocess.run([sys.executable, "-c", ARRIVALS, REPO, str(HOLD)], capture_output=True, text=True,
                          timeout=300, env=env)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": proc.stderr[-1500:]}


def arrivals_cases() -> List[dict]:
    """The arrival signal on NCCL (gang/arrivals.py): with TORCH_NCCL_ENABLE_TIMING=1 each collective's
    start on the device (procs/arrivals.device_ns), an all_reduce queued behind a GPU sleep read as late by
    the sleep, the five before it read within the watchdog's lateness of their enqueue; without timing,
    the host's enqueue time (the queued one read on time: a slow device is not seen); and what the timing
    costs a short step (a 2048 matmul and an all_reduce, 400 steps)."""
    on, off = _arrivals_run(True), _arrivals_run(False)
    out = []
    for name, said in (("timing on", on), ("timing off", off)):
        if "error" in said:
            out.append({"case": "nccl arrivals, %s" % name, "ok": False, "detail": said["error"]})
    if out:
        return out
    late = {seq: (device - created) / 1e6 for seq, device, created, _ in on["device"] if device}
    first = [late[s] for s in sorted(late)[:5]]
    held = late.get(6)
    seen = held is not None and held >= 0.5 * HOLD * 1000.0
    out.append({"case": "nccl arrivals with timing: the device's start, a slow device seen", "ok":
                on["clock"] == "device" and seen and on["pairs"] and len(first) == 5,
                "detail": json.dumps({"queued_behind_%.1fs_sleep_read_late_ms" % HOLD: held,
                                      "unobstructed_read_late_ms": [round(v, 2) for v in first],
                                      "pairs": on["pairs"][:3]})})
    host = {seq: created for seq, created in off["host"]}
    out.append({"case": "nccl arrivals without timing: the host's enqueue time", "ok": off["clock"] == "host"
                and all(d is None for _, d, _, _ in off["device"]) and [s for s, _ in off["host"]] == [1, 2, 3, 4, 5, 6],
                "detail": json.dumps({"enqueue_gap_6_ms": (host.get(6, 0) - host.get(5, 0)) / 1e6})})
    cost = (on["step_ms"] - off["step_ms"]) / off["step_ms"] * 100.0
    out.append({"case": "nccl timing's cost to a short step (world size 1)", "ok": True,
                "detail": json.dumps({"step_ms_on": round(on["step_ms"], 4), "step_ms_off": round(off["step_ms"], 4),
                                      "cost_pct": round(cost, 2)})})
    return out


def fork_guard_case() -> dict:
    proc = subprocess.run([sys.executable, "-c", FORK_GUARD, REPO], capture_output=True, text=True, timeout=300)
    try:
        said: Dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"case": "fork guard with CUDA initialised", "ok": False, "detail": proc.stderr[-1500:]}
    ok = said["after_import"] is None and "CUDA is initialized" in str(said["after_cuda"])
    return {"case": "fork guard: torch imported is safe, CUDA initialised refuses", "ok": ok,
            "detail": json.dumps(said)}


def main(argv: List[str]) -> int:
    results = []
    for backend in ("nccl", "cpu:gloo,cuda:nccl"):
        results += recorder_case(backend)
    results.append(fork_guard_case())
    results += arrivals_cases()
    for r in results:
        print("%-4s %-62s %s" % ("ok" if r["ok"] else "FAIL", r["case"], r["detail"][:200]))
    if len(argv) > 1:
        with open(argv[1], "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
