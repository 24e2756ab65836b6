"""The in-step restart (``@torchrun(restarts=N)``): what the gang's
coordination costs at scale, and what a restart costs end to end at 2 x 2.

1. ``--nodes 1024``: the real gang service in this process, N real
   authenticated clients in worker processes (``_restart_nodes.py``; the
   harness of ``gang_scale.py``). Every node enters call 0; the last active
   node reports a rank SIGKILLed; timed from that report: the service's
   decision, every node told (the ``restart`` message heard), every node's new
   rendezvous agreed (node 0 listening on the announced port, every other
   active node connected to it). No torch: the gang's share only.
   ``--spares K`` (hot spares, ``@torchrun(spares=K)``): N nodes of which K
   wait; the restart is a swap (the failed node out, the first spare in), and
   each run is paired with one of the same N nodes without spares. The
   harness checks that every node derived the same bench from its restart
   message, every node its torchrun node rank (the spare's among them), and
   that no benched node connected.
2. ``--flows K``: K real 2 x 2 local flows (CPU, gloo,
   tests/flows/scripts/restart_resume.py, ``restarts=1``): rank 3 SIGKILLs
   itself after step 1; from the failure (its cause's time) to the first line
   of the user's script in every new rank, with the phases between from the
   control's record (``in_step_restarts``) and the ranks' own stamps.
3. ``--hf-flows K``: K real 2 x 2 local flows of HF's Trainer
   (tests/flows/scripts/hf_snapshot.py, ``restarts=1``, snapshots in memory): rank 1 SIGKILLs
   itself at step ``--hf-kill-at``'s end (100 of 150: mid-training, about 20 s after the first step;
   10: about 1 s after it, while the warm processes still import what the ranks had loaded); from the failure to every new rank at the script and to its first
   step done, whether each new rank found transformers imported as its script began (forked from
   a warm process that had learned it), the record's ``restart_seconds`` and the ledger's
   ``stop`` and ``restart`` for that restart.
4. ``--swap-flows K``: K rounds of real local flows (2 processes a node),
   interleaved: a swap at 3 x 2 (``spares=1``; every rank on node 1 SIGKILLs
   itself after step 1, node 2 comes in) and in-place restarts beside it
   (``SWAP_CASES``: 3 x 2 without spares, rank 3 SIGKILLed once; the swap's
   shape with the failure on node 0; 2 x 2); the same measure as 2.

Results in ``benchmarks/results/restart_scale.json``. A benchmark, not a
test: nothing here asserts a timing.

    python benchmarks/restart_scale.py [--nodes 1024] [--spares 8] [--runs 3] [--flows 3] [--warm both]
                                       [--hf-flows 3] [--swap-flows 3]
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
    """``gang_scale.Gang`` with ``restarts=1`` and ``spares``."""

    def __init__(self, pool: Pool, n: int, join_bound: float, spares: int = 0):
        self.pool, self.n, self.join_bound, self.progress = pool, n, join_bound, False
        self.secret = os.urandom(32)
        config = GangConfig("restart-%s" % uuid.uuid4().hex[:8], n, heartbeat_timeout=60.0,
                            start_timeout=join_bound + 60, restarts=1, spares=spares)
        self.server = GangServer(config, gang_scale.HOST, [find_free_port()], secret=self.secret).start()
        self.shares = gang_scale.shares(n, pool.solo)


def coordination(n: int, workers: int, bound: float, spares: int = 0) -> Dict[str, Any]:
    failed = n - spares - 1  # the last active node: never node 0, never a spare
    row: Dict[str, Any] = {"nodes": n, "spares": spares, "active": n - spares, "failed_node": failed,
                           "load_1m": round(os.getloadavg()[0], 2)}
    pool = Pool(min(workers, n - 1))
    try:
        gang = RestartGang(pool, n, bound, spares)
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
            owner = gang.owner(failed)
            reported = pool.ask([owner], "report_kill", 10.0, node=failed)[owner]
            t0 = reported["t"] if reported else time.monotonic()
            got = pool.ask(everyone, "restart_status", bound + 10, seconds=bound)
            told = [t for r in got.values() if r for t in r["told"].values()]
            agreed = [t for r in got.values() if r for t in r["agreed"].values()]
            heard = [t for r in got.values() if r for t in r["heard"].values()]
            state = gang.server.handlers.book.calls[0]
            row.update({
                "decided_s": round(state.restarted_at - t0, 4) if state.restarted_at else None,
                "told": len(told), "agreed": len(agreed),
                "heard_p50_s": _late(heard, t0, 0.5), "heard_max_s": _late(heard, t0, 1.0),
                "told_p50_s": _late(told, t0, 0.5), "told_max_s": _late(told, t0, 1.0),
                "agreed_p50_s": _late(agreed, t0, 0.5), "agreed_max_s": _late(agreed, t0, 1.0),
                "false_abort": str(gang.server.cause.summary) if gang.server.cause else None,
            })
            row.update(bench_check(n, spares, failed, got))
        finally:
            gang.close()
    finally:
        pool.kill()
    return row


def _late(times: List[float], t0: float, q: float) -> Optional[float]:
    if not times:
        return None
    return round((max(times) if q >= 1.0 else percentile(times, q)) - t0, 4)


def bench_check(n: int, spares: int, failed: int, got: Dict[int, Any]) -> Dict[str, Any]:
    """What every node derived from its restart message, against what a swap
    of ``failed`` for the first spare must give (computed here from the
    indices alone, not with the product's ``Bench``): one bench for all, the
    failed node out, the first spare in, each node's torchrun node rank its
    place among the active nodes, its ``--nnodes`` the active count and its
    role right (``node_rank_errors``), and no benched node connected."""
    derived = {int(node): tuple(map(_tupled, d)) for r in got.values() if r for node, d in r["derived"].items()}
    agreed = {int(node) for r in got.values() if r for node in r["agreed"]}
    if spares:
        want_bench = (tuple(range(n - spares + 1, n)), (failed,), n - spares)
    else:
        want_bench = ((), (), None)
    benched = set(want_bench[0]) | set(want_bench[1])
    active = [node for node in range(n) if node not in benched]
    want_rank = {node: i for i, node in enumerate(active)}
    benches = {d[:3] for d in derived.values()}
    want_role = {node: "out" if node in want_bench[1] else "spare" if node in want_bench[0] else "active"
                 for node in range(n)}
    wrong_ranks = sorted(node for node, d in derived.items()
                         if d[3] != want_rank.get(node) or d[4] != len(active) or d[5] != want_role[node])
    out: Dict[str, Any] = {
        "derived": len(derived), "benches_seen": len(benches), "bench_ok": benches == {want_bench},
        "node_rank_errors": len(wrong_ranks), "node_rank_errors_first": wrong_ranks[:5],
        "active_agreed": len(agreed & set(active)), "benched_connected": len(agreed & benched),
    }
    if spares:
        spare_in = n - spares
        out.update({"spare_in": spare_in, "spare_in_node_rank": derived.get(spare_in, (None,) * 4)[3],
                    "spare_in_node_rank_expected": want_rank[spare_in]})
    return out


def _tupled(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


# The cases of ``--swap-flows``, one restart each: a swap, and in-place restarts beside it. A swap
# restarts 4 ranks (2 nodes of 2); "in-place" restarts 6 (3 nodes), the last two cases 4, as a swap does.
SWAP_CASES: Dict[str, Dict[str, Any]] = {
    # A bad GPU: every rank that starts on node 1 SIGKILLs itself after step 1; node 2 (the spare) comes in.
    "swap": {"nodes": 3, "attrs": {"restarts": 1, "spares": 1},
             "args": {"bad-node": 1, "steps": 3, "fail-rank": -1}},
    # Rank 3 (node 1) SIGKILLs itself after step 1 of the first start; every node's ranks restart in place.
    "in-place": {"nodes": 3, "attrs": {"restarts": 1, "spares": 0},
                 "args": {"fail-rank": 3, "fail-at": "0", "steps": 3}},
    # The swap's shape (2 active nodes, a spare waiting), the failure on node 0 (rank 1): restarts in place.
    "in-place-node-0": {"nodes": 3, "attrs": {"restarts": 1, "spares": 1},
                        "args": {"fail-rank": 1, "fail-at": "0", "steps": 3}},
    # 2 x 2, no spare: rank 3 (node 1) SIGKILLed once, as in "in-place".
    "in-place-2x2": {"nodes": 2, "attrs": {"restarts": 1, "spares": 0},
                     "args": {"fail-rank": 3, "fail-at": "0", "steps": 3}},
}


def run_flow(workdir: str, warm: bool, nodes: int, attrs: Dict[str, Any], args: Any,
             script: str = "restart_resume.py", nproc: int = 2) -> Dict[str, Any]:
    """One gang_flow.py run of ``script``: its events (restart_resume.py's, one per rank
    per start), the control's ``torchrun-result`` record and ``torchrun-goodput`` ledger, or its output's tail."""
    out = os.path.join(workdir, "out")
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, MFTR_TEST_OUT=out, METAFLOW_TORCHRUN_WARM_START="1" if warm else "0", METAFLOW_DATASTORE_SYSROOT_LOCAL=workdir,
               METAFLOW_USER=os.environ.get("METAFLOW_USER", "bench"),
               MFTR_TORCHRUN_ATTRS=json.dumps(attrs),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    began = time.monotonic()
    proc = subprocess.run([sys.executable, FLOW, "--no-pylint", "run", "--script", script, "--nproc", str(nproc),
                           "--nodes", str(nodes), "--script-args", json.dumps(args)],
                          cwd=workdir, env=env, capture_output=True, timeout=600)
    wall = round(time.monotonic() - began, 1)
    if proc.returncode != 0:
        said = (proc.stdout + proc.stderr).decode(errors="replace")
        return {"ok": False, "wall_s": wall, "tail": said[-2000:]}
    events = []
    if os.path.exists(os.path.join(out, "events.jsonl")):
        with open(os.path.join(out, "events.jsonl")) as f:
            events = [json.loads(line) for line in f if line.strip()]
    program = ("import json\nfrom metaflow import Flow, namespace\nnamespace(None)\n"
               "t = [t for t in Flow('GangFlow').latest_run['train'] if t.id.isdigit()][0]\n"
               "print(json.dumps([t.metadata_dict['torchrun-result'], t.metadata_dict.get('torchrun-goodput')]))")
    record, goodput = json.loads(subprocess.run([sys.executable, "-c", program], cwd=workdir, env=env,
                                                capture_output=True, text=True, timeout=120).stdout.strip().splitlines()[-1])
    return {"ok": True, "wall_s": wall, "events": events, "record": json.loads(record),
            "goodput": json.loads(goodput) if goodput else None, "out": out}


def restart_phases(events: List[Dict[str, Any]], record: Dict[str, Any]) -> Dict[str, Any]:
    """From the failure (its cause's time, in the control's record) to the
    control's stop and new torchrun, and to the first and the last new rank's
    first line of the user's script."""
    [r] = record["in_step_restarts"]
    failed = r["failed_at"]
    new = [e["script_at"] for e in events if e["restart"] == 1]
    first = [e["script_at"] for e in events if e["restart"] == 0]
    return {"control_stopped_s": _since(r.get("stopped_at"), failed),
            "control_new_torchrun_s": _since(r.get("restarted_at"), failed),
            "first_script_line_s": round(min(new) - failed, 3),
            "every_script_line_s": round(max(new) - failed, 3),
            "first_start_script_spread_s": round(max(first) - min(first), 3),
            "swapped_out": r.get("swapped_out"), "swapped_in": r.get("swapped_in")}


def one_flow(workdir: str, warm: bool = True) -> Dict[str, Any]:
    """One 2 x 2 flow whose rank 3 is SIGKILLed once; the restart's phases.
    ``warm``: the ranks forked from the node's warm process (procs/zygote.py),
    or started fresh (``METAFLOW_TORCHRUN_WARM_START=0``)."""
    load = os.getloadavg()[0]
    ran = run_flow(workdir, warm, 2, {"restarts": 1}, {"fail-at": "0", "steps": 2})
    if not ran["ok"]:
        return {"ok": False, "tail": ran["tail"]}
    phases = restart_phases(ran["events"], ran["record"])
    del phases["swapped_out"], phases["swapped_in"]
    return dict({"ok": True, "warm": warm, "load_1m": round(load, 2)}, **phases)


def hf_flow(workdir: str, kill_at: int, steps: int, pause: float) -> Dict[str, Any]:
    """One 2 x 2 flow of HF's Trainer whose rank 1 is SIGKILLed at step ``kill_at``'s end, once: from the
    failure to the new ranks at the script and to each one's first step done (hf_snapshot.py's
    stamps), and what the record and the ledger say that restart cost."""
    load = os.getloadavg()[0]
    args = ["--steps", str(steps), "--kill-at", str(kill_at), "--pause", str(pause)]
    ran = run_flow(workdir, True, 2, {"restarts": 1}, args, script="hf_snapshot.py")
    row: Dict[str, Any] = {"ok": ran["ok"], "kill_at": kill_at, "steps": steps, "pause": pause, "load_1m": round(load, 2),
                           "wall_s": ran["wall_s"]}
    if not ran["ok"]:
        return dict(row, tail=ran["tail"])
    [r] = ran["record"]["in_step_restarts"]
    failed = r["failed_at"]
    new = []
    for rank in range(4):
        with open(os.path.join(ran["out"], "starts-rank-%d.jsonl" % rank)) as f:
            starts = [json.loads(line) for line in f if line.strip()]
        new.append(starts[-1])
    segment = [s for s in (ran["goodput"] or {}).get("segments", []) if s.get("restart") == 1]
    parts = segment[0]["parts"] if segment else {}
    before = [s for s in (ran["goodput"] or {}).get("segments", []) if s.get("restart") is None]
    return dict(row, **{
        "resumed_at_step": sorted({s["first_step"] - 1 for s in new}),
        "new_ranks_found_transformers": [s["warm"] for s in new],
        "every_script_line_s": round(max(s["script_at"] for s in new) - failed, 3),
        "every_first_step_s": round(max(s["at"] for s in new) - failed, 3),
        "record_restart_seconds": r.get("restart_seconds"),
        "ledger_stop_s": before[0]["parts"].get("stop") if before else None,
        "ledger_restart_s": parts.get("restart")})


def swap_flow(workdir: str, case: str, warm: bool = True) -> Dict[str, Any]:
    """One flow of ``SWAP_CASES[case]`` (2 processes a node): the restart's
    phases, and where the new ranks ran (the swap: nodes 0 and 2, WORLD_SIZE 4)."""
    load = os.getloadavg()[0]
    shape = SWAP_CASES[case]
    ran = run_flow(workdir, warm, shape["nodes"], shape["attrs"], shape["args"])
    row: Dict[str, Any] = {"case": case, "nodes": shape["nodes"], "ok": ran["ok"], "warm": warm, "load_1m": round(load, 2),
                           "load_1m_after": round(os.getloadavg()[0], 2), "wall_s": ran["wall_s"]}
    if not ran["ok"]:
        return dict(row, tail=ran["tail"])
    events = ran["events"]
    row.update(restart_phases(events, ran["record"]))
    row["restart_nodes"] = sorted({e["node"] for e in events if e["restart"] == 1})
    row["restart_world_size"] = sorted({e["world_size"] for e in events if e["restart"] == 1})
    row["restart_resumed_from"] = sorted({str(e["resumed_from"]) for e in events if e["restart"] == 1})
    return row


def _commit() -> str:
    """The checkout measured (a shared working tree may hold others' edits beside it)."""
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return found.stdout.strip() or "?"


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
    p.add_argument("--spares", type=int, default=0,
                   help="of the nodes, this many hot spares: each run a swap, paired with a run without spares")
    p.add_argument("--runs", type=int, default=3, help="coordination runs (3); 0: none")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--bound", type=float, default=60.0, help="seconds any phase may take (60)")
    p.add_argument("--flows", type=int, default=2, help="2 x 2 flows with one restart each (2); 0: none")
    p.add_argument("--warm", choices=("on", "off", "both"), default="on",
                   help="ranks forked from the warm process (on), fresh (off), or each flow run both ways (both)")
    p.add_argument("--hf-flows", type=int, default=0,
                   help="2 x 2 flows of HF's Trainer, a rank SIGKILLed mid-training (0)")
    p.add_argument("--hf-kill-at", type=int, default=100, help="the step rank 1 dies at in --hf-flows (100)")
    p.add_argument("--hf-steps", type=int, default=150, help="of --hf-flows' steps (150)")
    p.add_argument("--hf-pause", type=float, default=0.02, help="a sample's read in --hf-flows (0.02: about 0.2 s a step)")
    p.add_argument("--swap-flows", type=int, default=0,
                   help="rounds of flows, a swap and in-place restarts beside it, interleaved (0)")
    p.add_argument("--swap-cases", default=",".join(SWAP_CASES), help="which of them (%(default)s)")
    p.add_argument("--replace", action="store_true", help="start the results afresh (default: add to them)")
    opts = p.parse_args(argv)
    rows: Dict[str, Any] = {"coordination": [], "flows": []}
    if os.path.exists(RESULTS) and not opts.replace:
        with open(RESULTS) as f:
            rows = json.load(f)
    stamp = {"at": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "commit": _commit()}
    coordinations(opts, rows, stamp)
    modes = {"on": [True], "off": [False], "both": [True, False]}[opts.warm]
    for run in range(opts.flows):
        for warm in modes:  # paired and interleaved where both
            with tempfile.TemporaryDirectory(prefix="restart-flow-") as workdir:
                _say("2 x 2 flow, run %d (%s)" % (run + 1, "warm" if warm else "fresh"))
                row = dict(stamp, **one_flow(workdir, warm))
                _say(json.dumps(row))
                rows["flows"].append(row)
                save(rows)
    for run in range(opts.hf_flows):
        with tempfile.TemporaryDirectory(prefix="hf-flow-") as workdir:
            _say("2 x 2 HF Trainer flow, run %d" % (run + 1))
            row = dict(stamp, **hf_flow(workdir, opts.hf_kill_at, opts.hf_steps, opts.hf_pause))
            _say(json.dumps(row))
            rows.setdefault("hf_flows", []).append(row)
            save(rows)
    for run in range(opts.swap_flows):
        for case in opts.swap_cases.split(","):
            with tempfile.TemporaryDirectory(prefix="swap-flow-") as workdir:
                _say("%d x 2 flow, %s, run %d" % (SWAP_CASES[case]["nodes"], case, run + 1))
                row = dict(stamp, **swap_flow(workdir, case, opts.warm != "off"))
                _say(json.dumps(row))
                rows.setdefault("swap_flows", []).append(row)
                save(rows)
    print(json.dumps(rows, indent=1))


def coordinations(opts: Any, rows: Dict[str, Any], stamp: Dict[str, str]) -> None:
    """``--runs`` runs at ``--nodes``; with ``--spares``, each a swap then
    the same gang without spares (in ``coordination_spares``)."""
    key = "coordination_spares" if opts.spares else "coordination"
    try:
        for run in range(opts.runs):
            for spares in ([opts.spares, 0] if opts.spares else [0]):
                _say("%d nodes (%d spares), run %d" % (opts.nodes, spares, run + 1))
                row = dict(stamp, **coordination(opts.nodes, opts.workers, opts.bound, spares))
                _say(json.dumps(row))
                rows.setdefault(key, []).append(row)
                save(rows)
    finally:
        kill_all()


if __name__ == "__main__":
    main()
