"""What a failure costs on this machine, locally, from the failure to the
first line of the user's script in the new ranks and on to training, with the
floors of each phase measured in the same run (issue 37).

The job (benchmarks/flows/resume_flow.py, benchmarks/scripts/resume_train.py):
a small DDP model with @checkpoint, 2 nodes x 2 processes, gloo, that fails
once after epoch 1. Three cases, run in turn (A, B, C, A, B, C ...) with the
floors before each round, so that load falls on all alike:

- ``retry/node-kill``: node 1's task SIGKILLed; @retry reruns the gang, which
  resumes from epoch 1's checkpoint;
- ``retry/rank-raise``: a rank of node 1 raises; @retry reruns the gang;
- ``instep/rank-kill``: a rank of node 1 SIGKILLs itself; the ranks start again
  inside the same tasks (``@torchrun(restarts=1)``, forked from the node's
  warm process unless METAFLOW_TORCHRUN_WARM_START=0).

Marks, in seconds from the failure (the failing rank's own note):

- detected: the record's cause time (retry only: the gang names it);
- old ranks gone: every rank process of the failed start has exited (this
  script watches their pids, every 20 ms);
- old tasks gone: both nodes' Metaflow tasks of attempt 0 have exited (retry);
- attempt 0 ended: Metaflow's own time stamp on its "Task failed." line;
- attempt 1 started: @torchrun's task_pre_step of the retry (our clock);
- step code: the step's code begins (every task_pre_step done, @checkpoint's
  load among them);
- gang formed: the last node of attempt 1 joined;
- first script line: the last new rank runs the first line of the script;
- torch imported, process group, first training line: the last new rank has
  imported torch, finished init_process_group, built the DDP model.

The floors: a bare ``python -c 'import torch'``; Metaflow's own start of a task
(a trivial two-step flow: the first step's last line to the second step's
first, and that task's process start to its step's first line); a bare
torchrun, static rendezvous, 2 processes, gloo, init_process_group only (its
launch to the last rank's first line, to torch imported, to the group).

Writes results/resume.json (every run, and the medians), prints the tables, and
draws docs/resume.png when matplotlib is there. ``--debug`` runs the flows
with METAFLOW_TORCHRUN_DEBUG=1 and keeps their output in results/resume-debug/.

    python benchmarks/resume.py [--repeat 3] [--cases retry/node-kill,instep/rank-kill]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FLOW = os.path.join(HERE, "flows", "resume_flow.py")
RESULTS = os.path.join(HERE, "results")
CASES = ["retry/node-kill", "retry/rank-raise", "instep/rank-kill"]
RETRY_MARKS = ["detected", "old ranks gone", "old tasks gone", "attempt 0 ended", "attempt 1 started",
               "step code", "gang formed", "first script line", "torch imported", "process group",
               "first training line"]
INSTEP_MARKS = ["old ranks gone", "first script line", "torch imported", "process group", "first training line"]
FLOORS = ["import torch", "metaflow: step to next step's code", "metaflow: task process to step code",
          "torchrun: launch to first script line", "torchrun: to torch imported", "torchrun: to process group",
          "torchrun: launch to exit"]
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) \[[^\]]*/train/[^\]]*\] (.*)$")


def _stamp(text: str) -> float:
    whole, frac = text.split(".")
    return time.mktime(time.strptime(whole, "%Y-%m-%d %H:%M:%S")) + float("0." + frac)


def first_line(log: str, needle: str, after: float) -> Optional[float]:
    for line in log.splitlines():
        m = _STAMP.match(line)
        if m and needle in m.group(2):
            t = _stamp(m.group(1))
            if t >= after:
                return t
    return None


def _env(workdir: str, **extra: str) -> Dict[str, str]:
    return dict(os.environ, METAFLOW_DATASTORE_SYSROOT_LOCAL=workdir,
                METAFLOW_USER=os.environ.get("METAFLOW_USER", "bench"),
                PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""), **extra)


# -- the floors ----------------------------------------------------------------

FLOOR_FLOW = '''
import os, time
from metaflow import FlowSpec, step


def _process_start():
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


class FloorFlow(FlowSpec):
    @step
    def start(self):
        self.left = time.time()
        self.next(self.end)

    @step
    def end(self):
        print("FLOOR %.3f %.3f %.3f" % (self.left, _process_start(), time.time()))


if __name__ == "__main__":
    FloorFlow()
'''

FLOOR_SCRIPT = '''
import os, time
T0 = time.time()
import torch
import torch.distributed as dist
T1 = time.time()
dist.init_process_group("gloo")
T2 = time.time()
print("TR %s %.6f %.6f %.6f" % (os.environ["RANK"], T0, T1, T2), flush=True)
dist.destroy_process_group()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def floors(workdir: str) -> Dict[str, float]:
    """One sample of each floor."""
    out: Dict[str, float] = {}
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    out["import torch"] = time.time() - t0
    flow = os.path.join(workdir, "floor_flow.py")
    with open(flow, "w") as f:
        f.write(FLOOR_FLOW)
    proc = subprocess.run([sys.executable, flow, "--no-pylint", "run"], cwd=workdir, env=_env(workdir),
                          capture_output=True, text=True, timeout=300)
    m = re.search(r"FLOOR ([\d.]+) ([\d.]+) ([\d.]+)", proc.stdout + proc.stderr)
    if m:
        left, started, code = (float(x) for x in m.groups())
        out["metaflow: step to next step's code"] = code - left
        out["metaflow: task process to step code"] = code - started
    script = os.path.join(workdir, "floor_rdzv.py")
    with open(script, "w") as f:
        f.write(FLOOR_SCRIPT)
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), script],
                          capture_output=True, text=True, timeout=300)
    t_exit = time.time()
    ranks = [tuple(float(x) for x in m.groups()) for m in re.finditer(r"TR \d+ ([\d.]+) ([\d.]+) ([\d.]+)", proc.stdout)]
    if len(ranks) == 2:
        out["torchrun: launch to first script line"] = max(r[0] for r in ranks) - t0
        out["torchrun: to torch imported"] = max(r[1] for r in ranks) - t0
        out["torchrun: to process group"] = max(r[2] for r in ranks) - t0
        out["torchrun: launch to exit"] = t_exit - t0
    return {k: round(v, 3) for k, v in out.items()}


# -- the failure cases ---------------------------------------------------------


def _gone(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


class Watcher(threading.Thread):
    """Notes when the failed start's rank processes, and attempt 0's tasks,
    have all exited (the ranks' own notes name their pids)."""

    def __init__(self, out: str) -> None:
        super().__init__(daemon=True)
        self.out, self.done = out, threading.Event()
        self.ranks_gone: Optional[float] = None
        self.tasks_gone: Optional[float] = None

    def _events(self) -> List[dict]:
        try:
            with open(os.path.join(self.out, "events.jsonl")) as f:
                return [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError):
            return []

    def run(self) -> None:
        ranks: List[int] = []
        tasks: List[int] = []
        while not self.done.is_set():
            events = self._events()
            if not ranks and any(e["event"] == "kill" for e in events):
                ranks = [e["pid"] for e in events if e["event"] == "script"]
                for node in (0, 1):
                    try:
                        with open(os.path.join(self.out, "task-pid-%d" % node)) as f:
                            tasks.append(int(f.read()))
                    except (OSError, ValueError):
                        pass
            now = time.time()
            if ranks and self.ranks_gone is None and all(_gone(p) for p in ranks):
                self.ranks_gone = now
            if tasks and self.tasks_gone is None and all(_gone(p) for p in tasks):
                self.tasks_gone = now
            time.sleep(0.02)


def one_run(workdir: str, case: str, debug: bool = False) -> Dict[str, object]:
    path, fail = case.split("/")
    out = os.path.join(workdir, "out")
    os.makedirs(out)
    env = _env(workdir, BENCH_OUT=out, BENCH_RESUME=json.dumps({"path": path, "fail": fail, "after": 1, "epochs": 2}))
    if debug:
        env["METAFLOW_TORCHRUN_DEBUG"] = "1"
    watcher = Watcher(out)
    watcher.start()
    started = time.time()
    proc = subprocess.run([sys.executable, FLOW, "--no-pylint", "run"], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=600)
    watcher.done.set()
    log = proc.stdout + proc.stderr
    if debug:
        os.makedirs(os.path.join(RESULTS, "resume-debug"), exist_ok=True)
        with open(os.path.join(RESULTS, "resume-debug", case.replace("/", "-") + ".log"), "w") as f:
            f.write(log)
    if proc.returncode != 0:
        raise RuntimeError("the flow failed:\n" + log[-3000:])
    with open(os.path.join(out, "events.jsonl")) as f:
        events = [json.loads(line) for line in f if line.strip()]
    kill = min(e["t"] for e in events if e["event"] == "kill")

    def last(event: str) -> Optional[float]:
        new = [e["t"] for e in events if e["event"] == event and e["t"] > kill]
        return max(new) if len(new) == 4 else None

    marks: Dict[str, Optional[float]] = {
        "old ranks gone": watcher.ranks_gone, "first script line": last("script"),
        "torch imported": last("imported"), "process group": last("group"), "first training line": last("start")}
    if path == "retry":
        record = _record(workdir, env)
        second = record["attempts"][1]
        with open(os.path.join(RESULTS, "resume-record.json"), "w") as f:  # the last retried run's attempts, as recorded
            json.dump({"attempts": record["attempts"]}, f, indent=1)
        marks.update({
            "detected": record["attempts"][0].get("ended_at"),
            "old tasks gone": watcher.tasks_gone,
            "attempt 0 ended": first_line(log, "Task failed.", kill),
            "attempt 1 started": second["started_at"],
            "step code": second.get("code_started_at"),
            "gang formed": second.get("gang_formed_at"),
        })
    names = RETRY_MARKS if path == "retry" else INSTEP_MARKS
    return {
        "case": case,
        "marks_s": {n: None if marks.get(n) is None else round(marks[n] - kill, 2) for n in names},  # type: ignore[operator]
        "run_s": round(time.time() - started, 1),
        "load_avg": os.getloadavg()[0],
    }


def _record(workdir: str, env: Dict[str, str]) -> dict:
    text = subprocess.run(
        [sys.executable, "-c",
         "import json; from metaflow import Flow, namespace; namespace(None)\n"
         "t = [t for t in Flow('BenchResumeFlow').latest_run['train'] if t.id.isdigit()][0]\n"
         "print(t.metadata_dict['torchrun-result'])"],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=120).stdout.strip().splitlines()[-1]
    return json.loads(text)


# -- the whole -----------------------------------------------------------------


def _median(values: List[Optional[float]]) -> Optional[float]:
    got = [v for v in values if v is not None]
    return round(statistics.median(got), 2) if got else None


def retry_shares(marks: Dict[str, float]) -> Dict[str, Optional[float]]:
    """A retry's time to the first script line, split by whose it is.

    Metaflow's (with @checkpoint's end): from the failed start's ranks gone to
    "Task failed.", from there to the retry's task_pre_step, and from the
    step's code to the gang formed (the other local nodes' tasks, which
    Metaflow starts). Our record, card and leaving (about 0.1 s) and the
    nodes' joining (milliseconds) sit inside those spans. Ours: the rest,
    from the failure to the old ranks gone, and from the gang formed to the
    first script line."""
    need = ("old ranks gone", "attempt 0 ended", "attempt 1 started", "step code", "gang formed",
            "first script line")
    if any(marks.get(n) is None for n in need):
        return {"metaflow's": None, "ours": None, "after attempt 1 started": None}
    theirs = ((marks["attempt 0 ended"] - marks["old ranks gone"]) + (marks["attempt 1 started"] - marks["attempt 0 ended"])
              + (marks["gang formed"] - marks["step code"]))
    return {"metaflow's": round(theirs, 2), "ours": round(marks["first script line"] - theirs, 2),
            "after attempt 1 started": round(marks["first script line"] - marks["attempt 1 started"], 2)}


def summarise(rounds: List[dict], cases: List[str]) -> Dict[str, object]:
    floors_ = {n: _median([r["floors"].get(n) for r in rounds]) for n in FLOORS}
    per_case, shares = {}, {}
    for case in cases:
        runs = [r["cases"][case] for r in rounds if case in r["cases"]]
        names = RETRY_MARKS if case.startswith("retry") else INSTEP_MARKS
        per_case[case] = {n: _median([run["marks_s"].get(n) for run in runs]) for n in names}
        if case.startswith("retry"):
            split = [retry_shares(run["marks_s"]) for run in runs]
            shares[case] = {k: _median([one[k] for one in split]) for k in ("metaflow's", "ours", "after attempt 1 started")}
    return {"floors_median_s": floors_, "marks_median_s": per_case, "retry_shares_median_s": shares}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--debug", action="store_true", help="METAFLOW_TORCHRUN_DEBUG=1; logs kept")
    parser.add_argument("--output", default=os.path.join(RESULTS, "resume.json"))
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    rounds: List[dict] = []
    for i in range(args.repeat):
        workdir = tempfile.mkdtemp(prefix="mftr-resume-")
        try:
            one = {"floors": floors(workdir), "load_avg": os.getloadavg()[0], "cases": {}}
            print("round %d floors: %s (load %.1f)" % (i + 1, one["floors"], one["load_avg"]), flush=True)
            for case in cases:
                case_dir = tempfile.mkdtemp(prefix="mftr-resume-", dir=workdir)
                try:
                    one["cases"][case] = one_run(case_dir, case, args.debug)
                except Exception as e:  # noqa: BLE001 -- a failed run is reported, the others go on
                    one["cases"][case] = {"case": case, "error": str(e)[-2000:], "marks_s": {}}
                print("round %d %s: %s" % (i + 1, case, one["cases"][case].get("marks_s") or
                                           one["cases"][case].get("error")), flush=True)
            rounds.append(one)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    summary = dict(summarise(rounds, cases), rounds=rounds, cpus=os.cpu_count(),
                   load_avg_at_end=os.getloadavg(), measured_at=time.strftime("%Y-%m-%d %H:%M:%S"),
                   what="2 nodes x 2 processes, gloo, local; seconds from the failure")
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(summary, f, indent=1)
    print(table(summary, cases))
    draw(summary, cases, os.path.join(REPO, "docs"))


def table(summary: Dict[str, object], cases: List[str]) -> str:
    rows = ["| floor | median |", "|---|---|"]
    for name, value in summary["floors_median_s"].items():  # type: ignore[union-attr]
        rows.append("| %s | %s |" % (name, "?" if value is None else "%.2f s" % value))
    for case in cases:
        rows += ["", "| %s: from the failure to | median |" % case, "|---|---|"]
        for name, value in summary["marks_median_s"][case].items():  # type: ignore[index]
            rows.append("| %s | %s |" % (name, "?" if value is None else "%.2f s" % value))
        for name, value in summary.get("retry_shares_median_s", {}).get(case, {}).items():  # type: ignore[union-attr]
            rows.append("| (to the first script line: %s) | %s |" % (name, "?" if value is None else "%.2f s" % value))
    return "\n".join(rows)


def draw(summary: Dict[str, object], cases: List[str], docs: str) -> None:
    """Each case's marks (medians) as one bar of phases."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no figure (pip install -r benchmarks/requirements.txt)")
        return
    fig, ax = plt.subplots(figsize=(9, 1.4 + 0.6 * len(cases)))
    colours: Dict[str, object] = {}
    for i, case in enumerate(cases):
        left = 0.0
        for name, value in summary["marks_median_s"][case].items():  # type: ignore[index]
            if value is None or value < left:
                continue
            colour = colours.setdefault(name, plt.cm.tab20(len(colours)))
            ax.barh(i, value - left, left=left, color=colour, label=name if list(colours)[-1] == name and
                    name not in ax.get_legend_handles_labels()[1] else None)
            left = value
        ax.text(left + 0.2, i, "%.1f s" % left, va="center", fontsize=8)
    ax.set_yticks(range(len(cases)), cases)
    ax.set_xlabel("seconds from the failure (medians); each colour ends at its mark")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    fig.tight_layout()
    fig.savefig(os.path.join(docs, "resume.png"), dpi=120)
    plt.close(fig)
    # The card's Attempts table, docs/card-attempts.png, is a real card's (tools/pictures/card_screenshot.py).


if __name__ == "__main__":
    main()
