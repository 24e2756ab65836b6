"""Failure-detection latency of @torchrun on this machine (2 nodes x 2 processes).

For each failure we measure the time from the failure to the moment no torchrun
agent or rank of the gang is left (frozen: no process of the *other* node is left;
the frozen node's own are killed when the step ends). Writes JSON and a table.

    python benchmarks/failure_latency.py [--repeat 3] [--heartbeat-timeout 10]
"""

import argparse
import json
import os
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from tests.integration.helpers import Gang, processes_with_token  # noqa: E402
from tests.integration.test_gang_failures import _node_task  # noqa: E402
from tests.integration.test_local_flows import _cmdline, _descendants  # noqa: E402

GANG_MARKERS = (b"torch.distributed.run", b"torchrun.bootstrap")


def gang_processes(token, exclude=()):
    return [
        p for p in processes_with_token(token)
        if p not in exclude and any(m in _cmdline(p) for m in GANG_MARKERS)
    ]


def wait_gone(token, exclude=(), cap=600.0):
    deadline = time.time() + cap
    while time.time() < deadline:
        if not gang_processes(token, exclude):
            return time.time()
        time.sleep(0.02)
    return None


def one(kind, tmp, hb):
    g = Gang(tmp)
    g.env["MFTR_TORCHRUN_ATTRS"] = json.dumps({"heartbeat_timeout": hb})
    script = "crash.py" if kind == "rank_crash" else "spin.py"
    proc = g.start("--script", script)
    try:
        g.wait_for_reports("ready-", 4, timeout=180)
        frozen = ()
        if kind == "rank_crash":
            path = os.path.join(g.out, "crash.json")
            deadline = time.time() + 60
            while not os.path.exists(path) and time.time() < deadline:
                time.sleep(0.02)
            with open(path) as f:
                t0 = json.load(f)["time"]
        elif kind == "node_killed":
            task = _node_task(proc.pid, 1)
            t0 = time.time()
            os.kill(task, signal.SIGKILL)
        elif kind == "node_frozen":
            task = _node_task(proc.pid, 1)
            frozen = tuple([task] + _descendants(task))
            t0 = time.time()
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)
        gone = wait_gone(g.token, exclude=frozen)
        proc.wait(timeout=120)
        return None if gone is None else gone - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        g.kill_everything()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--heartbeat-timeout", type=float, default=10.0)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "failure_latency.json"))
    args = ap.parse_args()
    import tempfile

    results = {}
    for kind in ("rank_crash", "node_killed", "node_frozen"):
        samples = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as tmp:
                samples.append(one(kind, tmp, args.heartbeat_timeout))
            print(kind, "%.2f s" % samples[-1] if samples[-1] is not None else "never", flush=True)
        done = [s for s in samples if s is not None]
        results[kind] = {
            "samples_s": samples,
            "median_s": statistics.median(done) if done else None,
            "max_s": max(done) if done else None,
        }
    results["heartbeat_timeout_s"] = args.heartbeat_timeout
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
