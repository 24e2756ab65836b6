"""The in-step restart (``@torchrun(restarts=N)``): what the gang's
coordination costs at scale, and what a restart costs end to end at 2 x 2.

1. ``--nodes 1024``: the real gang service in this process, N real
   authenticated clients in worker processes (``_restart_nodes.py``; the
   harness of ``gang_scale.py``). Every node enters call 0; the last node
   reports a rank SIGKILLed; timed from that report: the service's decision,
   every node told (the ``restart`` message heard), every node's new
   rendezvous agreed (node 0 listening on the announced port, every other
   node connected to it). No torch: the gang's share only.
2. ``--flows K``: K real 2 x 2 local flows (CPU, gloo,
   tests/flows/scripts/restart_resume.py, ``restarts=1``): rank 3 SIGKILLs
   itself after step 1; from the failure (its cause's time) to the first line
   of the user's script in every new rank, with the phases between from the
   control's record (``in_step_restarts``) and the ranks' own stamps.

Results in ``benchmarks/results/restart_scale.json``. A benchmark, not a
test: nothing here asserts a timing.

    python benchmarks/restart_scale.py [--nodes 1024] [--runs 3] [--flows 3] [--warm both]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import gang_scale  # noqa: E402
from _restart_nodes import restart_worker_main  # noqa: E402
from gang_scale import Gang, Pool, kill_all, percentile  # noqa: E402

from metaflow_extensions.torchrun.plugins.torchrun.gang.config import GangConfig  # noqa: E402
from metaflow_extensions.torchrun.plugins.torchrun.gang.ports import find_free_port  # noqa: E402
from metaflow_extensions.torchrun.plugins.torchrun.gang.server import GangServer  # noqa: E402

RESULTS = os.path.join(HERE, "results", "restart_scale.json")
FLOW = os.path.join(REPO, "tests", "flows", "gang_flow.py")
gang_scale.worker_main = restart_worker_main  # the pool's workers run RestartNodes


class RestartGang(Gang):
    """``gang_scale.Gang`` with ``restarts=1``."""

    def __init__(self, pool: Pool, n: int, join_bound: float):
        self.pool, self.n, self.join_bound, self.progress = pool, n, join_bound, False
        self.secret = os.urandom(32)
        config = GangConfig("restart-%s" % uuid.uuid4().hex[:8], n, heartbeat_timeout=60.0,
                            start_timeout=join_bound + 60, restarts=1)
        self.server = GangServer(config, gang_scale.HOST, [find_free_port()], secret=self.secret).start()
        self.shares = gang_scale.shares(n, pool.solo)


def coordination(n: int, workers: int, bound: float) -> Dict[str, Any]:
    row: Dict[str, Any] = {"nodes": n, "load_1m": round(os.getloadavg()[0], 2)}
    pool = Pool(min(workers, n - 1))
    try:
        gang = RestartGang(pool, n, bound)
        try:
            joined = gang.join()
            row["formed"] = joined["formed"]
            if not joined["formed"]:
                return row
            everyone = pool.everyone()
            pool.ask(everyone, "enter", 30.0)
            entered = pool.ask(everyone, "wait_entered", bound + 5, seconds=bound)
            row["entered"] = sum(r["entered"] for r in entered.values() if r)
            time.sleep(2.0)  # the join's and the calls' last messages land: not counted
            pool.ask(everyone, "arm", 30.0, bound=bound)
            time.sleep(0.5)  # every watcher is watching
            reported = pool.ask([pool.solo], "report_kill", 10.0, node=n - 1)[pool.solo]
            t0 = reported["t"] if reported else time.monotonic()
            got = pool.ask(everyone, "restart_status", bound + 10, seconds=bound)
            told = [t for r in got.values() if r for t in r["told"].values()]
            agreed = [t for r in got.values() if r for t in r["agreed"].values()]
            heard = [t for r in got.values() if r for t in r["heard"].values()]
            state = gang.server.calls[0]
            row.update({
                "decided_s": round(state.restarted_at - t0, 4) if state.restarted_at else None,
                "told": len(told), "agreed": len(agreed),
                "heard_p50_s": round(percentile([t - t0 for t in heard], 0.5), 4) if heard else None,
                "heard_max_s": round(max(heard) - t0, 4) if heard else None,
                "told_p50_s": round(percentile([t - t0 for t in told], 0.5), 4) if told else None,
                "told_max_s": round(max(told) - t0, 4) if told else None,
                "agreed_p50_s": round(percentile([t - t0 for t in agreed], 0.5), 4) if agreed else None,
                "agreed_max_s": round(max(agreed) - t0, 4) if agreed else None,
                "false_abort": str(gang.server.cause.summary) if gang.server.cause else None,
            })
        finally:
            gang.close()
    finally:
        pool.kill()
    return row


def one_flow(workdir: str, warm: bool = True) -> Dict[str, Any]:
    """One 2 x 2 flow whose rank 3 is SIGKILLed once; the restart's phases.
    ``warm``: the ranks forked from the node's warm process (procs/zygote.py),
    or started fresh (``METAFLOW_TORCHRUN_WARM_START=0``)."""
    out = os.path.join(workdir, "out")
    env = dict(os.environ, MFTR_TEST_OUT=out, METAFLOW_TORCHRUN_WARM_START="1" if warm else "0", METAFLOW_DATASTORE_SYSROOT_LOCAL=workdir,
               METAFLOW_USER=os.environ.get("METAFLOW_USER", "bench"),
               MFTR_TORCHRUN_ATTRS=json.dumps({"restarts": 1}),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    args = json.dumps({"fail-at": "0", "steps": 2})
    load = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, FLOW, "--no-pylint", "run", "--script", "restart_resume.py",
                           "--script-args", args], cwd=workdir, env=env, capture_output=True, timeout=600)
    if proc.returncode != 0:
        return {"ok": False, "tail": proc.stdout.decode(errors="replace")[-2000:]}
    with open(os.path.join(out, "events.jsonl")) as f:
        events = [json.loads(line) for line in f if line.strip()]
    program = ("import json\nfrom metaflow import Flow, namespace\nnamespace(None)\n"
               "t = [t for t in Flow('GangFlow').latest_run['train'] if t.id.isdigit()][0]\n"
               "print(t.metadata_dict['torchrun-result'])")
    record = json.loads(subprocess.run([sys.executable, "-c", program], cwd=workdir, env=env, capture_output=True,
                                       text=True, timeout=120).stdout.strip().splitlines()[-1])
    [r] = record["in_step_restarts"]
    failed = r["failed_at"]
    new = [e["script_at"] for e in events if e["restart"] == 1]
    return {"ok": True, "warm": warm, "load_1m": round(load, 2),
            "control_stopped_s": _since(r.get("stopped_at"), failed),
            "control_new_torchrun_s": _since(r.get("restarted_at"), failed),
            "first_script_line_s": round(min(new) - failed, 3),
            "every_script_line_s": round(max(new) - failed, 3),
            "first_start_script_spread_s": round(max(e["script_at"] for e in events if e["restart"] == 0)
                                                 - min(e["script_at"] for e in events if e["restart"] == 0), 3)}


def _since(t: Optional[float], origin: float) -> Optional[float]:
    return round(t - origin, 3) if t is not None else None


def _say(text: str) -> None:
    print("restart_scale: " + text, file=sys.stderr, flush=True)


def save(rows: Dict[str, Any]) -> None:
    """After every run: a run cut short still leaves the ones before it."""
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(rows, f, indent=1)


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1024)
    p.add_argument("--runs", type=int, default=3, help="coordination runs (3)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--bound", type=float, default=60.0, help="seconds any phase may take (60)")
    p.add_argument("--flows", type=int, default=2, help="2 x 2 flows with one restart each (2); 0: none")
    p.add_argument("--warm", choices=("on", "off", "both"), default="on",
                   help="ranks forked from the warm process (on), fresh (off), or each flow run both ways (both)")
    p.add_argument("--replace", action="store_true", help="start the results afresh (default: add to them)")
    opts = p.parse_args(argv)
    rows: Dict[str, Any] = {"coordination": [], "flows": []}
    if os.path.exists(RESULTS) and not opts.replace:
        with open(RESULTS) as f:
            rows = json.load(f)
    stamp = {"at": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    try:
        for run in range(opts.runs):
            _say("%d nodes, run %d" % (opts.nodes, run + 1))
            row = dict(stamp, **coordination(opts.nodes, opts.workers, opts.bound))
            _say(json.dumps(row))
            rows["coordination"].append(row)
            save(rows)
    finally:
        kill_all()
    modes = {"on": [True], "off": [False], "both": [True, False]}[opts.warm]
    for run in range(opts.flows):
        for warm in modes:  # paired and interleaved where both
            with tempfile.TemporaryDirectory(prefix="restart-flow-") as workdir:
                _say("2 x 2 flow, run %d (%s)" % (run + 1, "warm" if warm else "fresh"))
                row = dict(stamp, **one_flow(workdir, warm))
                _say(json.dumps(row))
                rows["flows"].append(row)
                save(rows)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
