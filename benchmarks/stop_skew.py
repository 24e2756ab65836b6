"""The skew of a gang-wide stop (issue 35): when one node is told to stop, how
far apart are the moments the nodes' ranks are told?

Two measurements, neither a test (nothing here asserts a timing):

- ``real``: a real local run of 2 nodes x 2 processes (``tests/flows/gang_flow.py``
  with ``collective_save.py``); only node 1's task gets SIGTERM. Every rank
  writes the time its SIGTERM handler started (``told-<rank>.json``): the skew
  is the last rank's minus the first's, torchrun's agents forwarding the signal
  included. Every process is on this host: one clock.
- ``simulated``: the project's real gang service and N real gang clients (no
  torch, no flow; ``gang_scale.py``'s harness); once the gang formed, one node
  reports the stop as a call's ``GangStop`` does. The skew is the last client's
  moment of hearing the verdict minus the first's (CLOCK_MONOTONIC, one host).
  A real node acts on it at its supervisor's next tick (``interval``, 0.1 s),
  so a real gang's skew is this plus at most 0.1 s plus the agents' forwarding.
  Here all N clients share this host's cores, so their reader threads wait for
  a core; ``service_broadcast_s`` is the service's own part: the time its one
  loop takes to hand the verdict to every node's socket.

    python benchmarks/stop_skew.py [--real-runs 3] [--nodes 1024] [--runs 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import gang_scale  # noqa: E402
from gang_scale import Gang, Pool, kill_all, percentile  # noqa: E402

RESULTS = os.path.join(HERE, "results", "stop_skew.json")
FLOW = os.path.join(ROOT, "tests", "flows", "gang_flow.py")


def _children() -> Dict[int, List[int]]:
    kids: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name, "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except OSError:
                continue
            kids.setdefault(ppid, []).append(int(name))
    return kids


def _node1_task(root: int) -> Optional[int]:
    """The local Metaflow task of node 1 (``--ubf-context ubf_task``)."""
    kids, stack = _children(), [root]
    while stack:
        for pid in kids.get(stack.pop(), []):
            stack.append(pid)
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    cmd = f.read().replace(b"\0", b" ")
            except OSError:
                continue
            if b" step " in cmd and b"ubf_task" in cmd:
                return pid
    return None


def real_run(save_seconds: float) -> Dict[str, Any]:
    """One 2 x 2 local run; SIGTERM to node 1's task once every rank is ready."""
    with tempfile.TemporaryDirectory(prefix="stop-skew-") as tmp:
        out = os.path.join(tmp, "out")
        os.makedirs(out)
        env = dict(os.environ, MFTR_TEST_OUT=out, METAFLOW_DATASTORE_SYSROOT_LOCAL=tmp,
                   MFTR_SAVE_SECONDS=str(save_seconds), MFTR_TORCHRUN_ATTRS=json.dumps({"shutdown_grace": 30}),
                   METAFLOW_USER=os.environ.get("METAFLOW_USER", "bench"), MFTR_BENCH_TOKEN=uuid.uuid4().hex)
        proc = subprocess.Popen([sys.executable, FLOW, "--no-pylint", "run", "--script", "collective_save.py"],
                                cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while len([n for n in os.listdir(out) if n.startswith("ready-")]) < 4:
                if proc.poll() is not None or time.monotonic() > deadline:
                    return {"error": "the gang did not start"}
                time.sleep(0.2)
            task = _node1_task(proc.pid)
            if task is None:
                return {"error": "no task for node 1"}
            os.kill(task, signal.SIGTERM)
            proc.wait(timeout=save_seconds + 120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        told = [json.load(open(os.path.join(out, n)))["at"] for n in os.listdir(out) if n.startswith("told-")]
        saved = len([n for n in os.listdir(out) if n.startswith("ckpt-")])
    return {"ranks_told": len(told), "ranks_saved": saved,
            "skew_s": round(max(told) - min(told), 4) if told else None}


def simulated_run(n: int, workers: int) -> Dict[str, Any]:
    pool = Pool(min(workers, max(1, n - 1)))
    try:
        gang = Gang(pool, n, heartbeat_timeout=30.0, join_bound=120.0)
        try:
            joined = gang.join()
            if not joined.get("formed"):
                return {"error": "the gang did not form", "join": joined}
            time.sleep(2.0)
            sent: Dict[str, float] = {}
            abort = gang.server.handlers.abort  # the service's one broadcast: timed where it runs, in this process

            def timed_abort(cause: Any) -> None:
                began = time.monotonic()
                abort(cause)
                sent["s"] = time.monotonic() - began

            gang.server.handlers.abort = timed_abort  # type: ignore[method-assign]
            told = n // 2
            owner = gang.owner(told)
            got = pool.ask([owner], "report", 10.0, node=told, stop=True)[owner]
            if not got:
                return {"error": "the stop could not be reported"}
            stamps = pool.ask(pool.everyone(), "wait_causes", 40.0, seconds=30.0)
            causes = {k: c for r in stamps.values() if r for k, c in r["causes"].items()}
            at = [c[0] for c in causes.values()]
            kinds = {c[1] for c in causes.values()}
            return {"told_node": told, "nodes_told": len(causes), "kinds": sorted(kinds),
                    "service_broadcast_s": round(sent["s"], 4) if "s" in sent else None,
                    "load_1m": round(os.getloadavg()[0], 1),
                    "skew_s": round(max(at) - min(at), 4) if at else None,
                    "from_report_p50_s": round(percentile([a - got["t"] for a in at], 0.5), 4) if at else None,
                    "from_report_max_s": round(max(at) - got["t"], 4) if at else None}
        finally:
            gang.close()
    finally:
        pool.kill()


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--real-runs", type=int, default=3)
    p.add_argument("--save-seconds", type=float, default=3.0)
    p.add_argument("--nodes", type=int, default=1024)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--out", default=RESULTS)
    opts = p.parse_args(argv)
    base = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": gang_scale._commit(), "cores": os.cpu_count()}
    rows = []
    try:
        for k in range(opts.real_runs):
            rows.append(dict(base, kind="real", nodes=2, nproc=2, run=k + 1, **real_run(opts.save_seconds)))
            print(json.dumps(rows[-1]), flush=True)
        for k in range(opts.runs):
            rows.append(dict(base, kind="simulated", nodes=opts.nodes, run=k + 1,
                             **simulated_run(opts.nodes, opts.workers)))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        kill_all()
    os.makedirs(os.path.dirname(opts.out), exist_ok=True)
    with open(opts.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
