"""Resuming from memory against resuming from a disk checkpoint, side by side in one run.

The job (benchmarks/flows/snapshot_flow.py, benchmarks/scripts/snapshot_bench_train.py): data-parallel
training of a ~48 MB state (float32 weights and SGD momentum), 2 processes a node, gloo, CPU. Each case
runs it twice: (a) ``snapshot.save`` every step (snapshots on, the default with ``restarts``), and
(b) ``@torchrun(snapshots=False)`` with rank 0 ``torch.save``-ing the same state to a local directory
every E steps, the ranks resuming from it.

Cases (run in turn, A/B of each case next to each other, so load falls on both alike):

- ``instep``: 2 x 2, ``restarts=1``; global rank 3 SIGKILLs itself after step --fail-step.
- ``swap``: 3 nodes, ``spares=1``, ``restarts=1``; node 1's ranks SIGKILL themselves after that step,
  node 2 (the spare) takes its place (from memory: node 1's copy fetched from a peer).

Per failure: the steps lost (the killed rank's last completed step minus the step the gang resumed at);
the failure (the killed rank's own wall-clock stamp) to the new ranks' first script line, to the state
loaded, and to the first training step completed by every rank (at full size); and from the first start's
steps, the snapshot's and the disk checkpoint's cost per step, by the script's own timing.

``--goodput``: instead, one long run of each mode at 3 nodes (``restarts=3, spares=1``) with three failures
on a schedule (a rank of node 0 killed: in place; node 0's ranks die: in place; node 1's ranks die: a
swap), and the goodput ledger's ``effective_percent`` of each; beside it, the same share computed from the
ranks' stamps (the steps kept, those not done again after a failure, over the ledger's wall time).

Results in ``benchmarks/results/snapshot_resume.json`` (each run, with the load average). A benchmark,
not a test: nothing here asserts a timing.

    python benchmarks/snapshot_resume.py [--repeat 2] [--disk-every 10]
    python benchmarks/snapshot_resume.py --goodput [--goodput-steps 1200 --step-sleep 0.3]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FLOW = os.path.join(HERE, "flows", "snapshot_flow.py")
RESULTS = os.path.join(HERE, "results", "snapshot_resume.json")
CASES: Dict[str, Dict[str, Any]] = {
    "instep": {"nodes": 2, "attrs": {"restarts": 1}, "who": "rank:3"},
    "swap": {"nodes": 3, "attrs": {"restarts": 1, "spares": 1}, "who": "node:1"},
}
MODES = ("snapshot", "disk")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _load() -> List[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _mode_args(mode: str, disk_every: int) -> List[str]:
    return ["--every", "1"] if mode == "snapshot" else ["--every", "0", "--disk-every", str(disk_every)]


def _mode_attrs(mode: str, attrs: Dict[str, Any]) -> Dict[str, Any]:
    return dict(attrs) if mode == "snapshot" else dict(attrs, snapshots=False)


def run_flow(workdir: str, nodes: int, attrs: Dict[str, Any], script_args: List[str], timeout: int) -> Dict[str, Any]:
    """One flow; its output dir, and the control task's result record and goodput ledger."""
    out = os.path.join(workdir, "out")
    env = dict(os.environ, MFTR_TEST_OUT=out, METAFLOW_DATASTORE_SYSROOT_LOCAL=workdir,
               METAFLOW_USER=os.environ.get("METAFLOW_USER", "bench"), BENCH_TORCHRUN_ATTRS=json.dumps(attrs),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    began = time.monotonic()
    proc = subprocess.run([sys.executable, FLOW, "--no-pylint", "run", "--nodes", str(nodes),
                           "--script-args", json.dumps(script_args)],
                          cwd=workdir, env=env, capture_output=True, timeout=timeout)
    wall = round(time.monotonic() - began, 1)
    said = (proc.stdout + proc.stderr).decode(errors="replace")
    if proc.returncode != 0:
        return {"ok": False, "wall_s": wall, "tail": said[-3000:]}
    program = ("import json\nfrom metaflow import Flow, namespace\nnamespace(None)\n"
               "t = Flow('BenchSnapshotFlow').latest_run['train'].control_task\n"
               "print(json.dumps({'result': json.loads(t.metadata_dict['torchrun-result']),"
               " 'goodput': json.loads(t.metadata_dict.get('torchrun-goodput') or 'null')}))")
    read = subprocess.run([sys.executable, "-c", program], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=120)
    record = json.loads(read.stdout.strip().splitlines()[-1])
    lines = [line for line in said.splitlines() if "resumed at step" in line or "no snapshot" in line]
    return dict(record, ok=True, wall_s=wall, out=out, resume_lines=lines[:8])


def _json(path: str) -> Dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def _steps(out: str, restart: int) -> Dict[int, List[Dict[str, Any]]]:
    """Each rank's step stamps in that start, by rank."""
    found: Dict[int, List[Dict[str, Any]]] = {}
    for path in glob.glob(os.path.join(out, "steps-%d-rank-*.jsonl" % restart)):
        with open(path) as f:
            found[int(path.rsplit("-", 1)[1].split(".")[0])] = [json.loads(x) for x in f if x.strip()]
    return found


def _starts(out: str, restart: int) -> List[Dict[str, Any]]:
    return [_json(p) for p in glob.glob(os.path.join(out, "start-%d-rank-*.json" % restart))]


def failures(out: str, record: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Each failure: its step, where the gang resumed and from what, the steps lost, and the failure
    (the first dying rank's stamp) to the new ranks' first line, state loaded, and first step by all."""
    rows: List[Dict[str, Any]] = []
    restarts = record.get("in_step_restarts") or []
    for r in range(len(restarts)):
        kills = [_json(p) for p in glob.glob(os.path.join(out, "kill-%d-rank-*.json" % r))]
        starts, steps = _starts(out, r + 1), _steps(out, r + 1)
        if not kills or not starts:
            rows.append({"restart": r, "missing": True})
            continue
        failed_at, failed_step = min(k["at"] for k in kills), max(k["step"] for k in kills)
        resumed = min(s["resumed"] for s in starts)
        firsts = [ranks[0]["at"] for ranks in steps.values() if ranks]
        rec = restarts[r]
        row: Dict[str, Any] = {
            "restart": r, "failed_step": failed_step, "resumed_step": resumed,
            "source": sorted({str(s["source"]) for s in starts}), "steps_lost": failed_step - resumed,
            "to_first_script_line_s": round(max(s["script_at"] for s in starts) - failed_at, 3),
            "to_imported_s": round(max(s["imported_at"] for s in starts) - failed_at, 3),
            "to_process_group_s": round(max(s["group_at"] for s in starts) - failed_at, 3),
            "to_model_built_s": round(max(s["built_at"] for s in starts) - failed_at, 3),
            "to_state_loaded_s": round(max(s["loaded_at"] for s in starts) - failed_at, 3),
            "load_s": round(max(s["loaded_at"] - s["built_at"] for s in starts), 3),
            "to_first_full_step_s": round(max(firsts) - failed_at, 3) if len(firsts) == len(starts) else None,
            # the model and optimizer built: the first optimizer of a rank imports torch._dynamo (~2.4 CPU-s)
            "build_s": round(max(s["built_at"] for s in starts) - max(s["group_at"] for s in starts), 3),
            "record": {k: rec.get(k) for k in ("resumed_step", "steps_lost", "resumed_from", "swapped_out",
                                               "swapped_in")},
        }
        rows.append(row)
    return rows


def step_cost(out: str, skip: int = 3) -> Dict[str, Any]:
    """From the first start's steps (the first ``skip`` left out, and the last before the failure): the
    mean compute (forward, backward, all-reduce, optimizer), snapshot save and disk save per step, over
    every rank, and rank 0's wall time per step (step stamp to step stamp)."""
    steps = _steps(out, 0)
    rows = [s for ranks in steps.values() for s in ranks[skip:-1]]
    if not rows:
        return {}
    compute = statistics.mean(s["compute"] for s in rows)
    save = statistics.mean(s["save"] for s in rows)
    wrote = [s["disk"] for s in rows if s["disk"] > 0.001]  # rank 0's saves (a step without one: microseconds)
    disk = statistics.mean(wrote) if wrote else 0.0
    r0 = steps.get(0, [])[skip:-1]
    gaps = [b["at"] - a["at"] for a, b in zip(r0, r0[1:])]
    saves = sum(1 for s in r0 if s["disk"] > 0.001)
    per_step_disk = disk * saves / max(1, len(r0))
    return {"compute_ms": round(1000 * compute, 1), "snapshot_save_ms": round(1000 * save, 1),
            "disk_save_ms_each": round(1000 * disk, 1), "disk_save_ms_per_step": round(1000 * per_step_disk, 1),
            "snapshot_cost_percent": round(100 * save / compute, 1),
            "disk_cost_percent": round(100 * per_step_disk / compute, 1),
            "rank0_wall_per_step_ms": round(1000 * statistics.mean(gaps), 1) if gaps else None}


def kept_training(out: str, wall: Optional[float]) -> Dict[str, Any]:
    """The steps kept (those no later start did again) and the time they took, from rank 0's stamps:
    each step from its predecessor's stamp in the same start (the first from the state loaded)."""
    restarts = sorted(int(p.rsplit("start-", 1)[1].split("-")[0]) for p in glob.glob(os.path.join(out, "start-*-rank-0.json")))
    kept_s, kept_steps, done_s = 0.0, 0, 0.0
    for r in restarts:
        start = _json(os.path.join(out, "start-%d-rank-0.json" % r))
        nxt = os.path.join(out, "start-%d-rank-0.json" % (r + 1))
        until = _json(nxt)["resumed"] if os.path.exists(nxt) else None
        prev = start["loaded_at"]
        for s in _steps(out, r).get(0, []):
            took, prev = s["at"] - prev, s["at"]
            done_s += took
            if until is None or s["step"] <= until:
                kept_s += took
                kept_steps += 1
    row = {"kept_steps": kept_steps, "kept_training_s": round(kept_s, 1), "training_done_s": round(done_s, 1)}
    if wall:
        row["kept_percent_of_wall"] = round(100 * kept_s / wall, 2)
    return row


def _ledger(goodput: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    if not goodput:
        return {}
    segs = [{k: s.get(k) for k in ("restart", "seconds", "cause", "lost_seconds", "time_to_restart", "steps_lost",
                                   "swapped_in")} for s in goodput.get("segments", [])]
    return {"effective_percent": goodput.get("effective_percent"), "wall_seconds": goodput.get("wall_seconds"),
            "lost_seconds": goodput.get("lost_seconds"), "parts": goodput.get("parts"), "segments": segs}


def one(case: str, mode: str, opts: argparse.Namespace) -> Dict[str, Any]:
    shape = CASES[case]
    args = ["--steps", str(opts.steps), "--mb", str(opts.mb), "--batch", str(opts.batch),
            "--fail", "%d:%s" % (opts.fail_step, shape["who"])] + _mode_args(mode, opts.disk_every)
    load = _load()
    with tempfile.TemporaryDirectory(prefix="bench-snap-") as workdir:
        ran = run_flow(workdir, shape["nodes"], _mode_attrs(mode, shape["attrs"]), args, timeout=600)
        row: Dict[str, Any] = {"case": case, "mode": mode, "ok": ran["ok"], "load_before": load,
                               "load_after": _load(), "flow_wall_s": ran["wall_s"]}
        if not ran["ok"]:
            return dict(row, tail=ran["tail"])
        row["failures"] = failures(ran["out"], ran["result"])
        row["cost"] = step_cost(ran["out"])
        row["ledger"] = _ledger(ran["goodput"])
        row["resume_lines"] = ran["resume_lines"]
    return row


def goodput_run(mode: str, opts: argparse.Namespace) -> Dict[str, Any]:
    n, off = opts.goodput_steps, opts.disk_every // 2  # half a checkpoint's interval after one: its mean loss
    # At 3/10, 6/10 and 9/10 of the run: with 1,200 steps of about half a second, a failure every 3 minutes.
    plan = "%d:rank:1,%d:node:0,%d:node:1" % (3 * n // 10 + off, 6 * n // 10 + off, 9 * n // 10 + off)
    args = ["--steps", str(n), "--mb", str(opts.mb), "--batch", str(opts.batch), "--step-sleep",
            str(opts.step_sleep), "--fail", plan] + _mode_args(mode, opts.disk_every)
    attrs = _mode_attrs(mode, {"restarts": 3, "spares": 1})
    load = _load()
    with tempfile.TemporaryDirectory(prefix="bench-goodput-") as workdir:
        ran = run_flow(workdir, 3, attrs, args, timeout=3600)
        row: Dict[str, Any] = {"mode": mode, "ok": ran["ok"], "plan": plan, "load_before": load,
                               "load_after": _load(), "flow_wall_s": ran["wall_s"]}
        if not ran["ok"]:
            return dict(row, tail=ran["tail"])
        ledger = _ledger(ran["goodput"])
        row["ledger"] = ledger
        row["failures"] = failures(ran["out"], ran["result"])
        row["stamps"] = kept_training(ran["out"], ledger.get("wall_seconds"))
        row["cost"] = step_cost(ran["out"])
    return row


def _commit() -> str:
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return found.stdout.strip() or "?"


def save_results(key: str, value: Any) -> None:
    """Merged into the results file: the side-by-side cases and the goodput runs are run apart."""
    data: Dict[str, Any] = {}
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            data = json.load(f)
    data[key] = value
    with open(RESULTS, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def _summary(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Medians per case and mode."""
    out: Dict[str, Any] = {}
    for case in CASES:
        for mode in MODES:
            mine = [r for r in rows if r["case"] == case and r["mode"] == mode and r["ok"]]
            fails = [f for r in mine for f in r["failures"] if not f.get("missing")]
            if not fails:
                continue

            def med(key: str, src: List[Dict[str, Any]]) -> Optional[float]:
                vals = [x[key] for x in src if x.get(key) is not None]
                return round(statistics.median(vals), 3) if vals else None

            out["%s/%s" % (case, mode)] = {
                "runs": len(mine), "steps_lost": [f["steps_lost"] for f in fails],
                "to_first_script_line_s": med("to_first_script_line_s", fails),
                "to_imported_s": med("to_imported_s", fails),
                "to_process_group_s": med("to_process_group_s", fails),
                "to_model_built_s": med("to_model_built_s", fails),
                "to_state_loaded_s": med("to_state_loaded_s", fails),
                "load_s": med("load_s", fails),
                "build_s": med("build_s", fails),
                "to_first_full_step_s": med("to_first_full_step_s", fails),
                "compute_ms": med("compute_ms", [r["cost"] for r in mine]),
                "snapshot_save_ms": med("snapshot_save_ms", [r["cost"] for r in mine]),
                "snapshot_cost_percent": med("snapshot_cost_percent", [r["cost"] for r in mine]),
                "disk_save_ms_each": med("disk_save_ms_each", [r["cost"] for r in mine]),
                "disk_cost_percent": med("disk_cost_percent", [r["cost"] for r in mine]),
                "rank0_wall_per_step_ms": med("rank0_wall_per_step_ms", [r["cost"] for r in mine]),
            }
    return out


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--cases", default="instep,swap")
    ap.add_argument("--mb", type=float, default=48.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--fail-step", type=int, default=25)
    ap.add_argument("--disk-every", type=int, default=10)
    ap.add_argument("--goodput", action="store_true")
    ap.add_argument("--goodput-steps", type=int, default=1200)
    ap.add_argument("--step-sleep", type=float, default=0.3)
    ap.add_argument("--modes", default=",".join(MODES), help="the modes run, in turn (%(default)s)")
    opts = ap.parse_args(argv)
    stamp = {"commit": _commit(), "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(),
             "argv": sys.argv[1:]}
    if opts.goodput:
        runs = []
        modes = tuple(opts.modes.split(","))
        key = "goodput-%d-steps" % opts.goodput_steps + ("" if modes == MODES else "-" + "-".join(modes))
        for mode in modes:
            _say("goodput: %s ..." % mode)
            runs.append(goodput_run(mode, opts))
            _say(json.dumps({k: runs[-1].get(k) for k in ("mode", "ok", "flow_wall_s", "stamps")}))
            _say(json.dumps((runs[-1].get("ledger") or {}).get("effective_percent")))
            save_results(key, dict(stamp, runs=runs))
        return
    rows: List[Dict[str, Any]] = []
    for _ in range(opts.repeat):
        for case in opts.cases.split(","):
            for mode in MODES:
                _say("%s/%s ..." % (case, mode))
                rows.append(one(case, mode, opts))
                _say(json.dumps({k: rows[-1].get(k) for k in ("ok", "flow_wall_s", "failures", "cost")})[:1500])
                save_results("cases", dict(stamp, rows=rows, summary=_summary(rows)))
    print(json.dumps(_summary(rows), indent=1))


if __name__ == "__main__":
    main()
