"""What a node's failure costs on this machine, locally: from node 1's task
SIGKILLed after epoch 2 of attempt 0 to the first training line of attempt 1,
which resumes from epoch 2's checkpoint (tests/flows/checkpoint_flow.py:
@retry @checkpoint @torchrun, 2 nodes x 2 processes, gloo, metaflow-checkpoint).

Phases, each from the end of the one before:

- detected: the gang names the lost node (attempt 0's cause, in the record);
- attempt 0 ended: the control task ends (Metaflow's "Task failed." line);
- attempt 1 started: Metaflow has started attempt 1's task and imported the
  flow, up to @torchrun's task_pre_step (locally, minutes_between_retries=0);
- checkpoint loaded: the step's code begins: every task_pre_step done,
  @checkpoint's load of epoch 2's checkpoint among them;
- call started: ``current.torch.run`` of attempt 1 begins on the control;
- gang formed: node 1's task (started by the control, locally) has joined;
- first training line: every rank of attempt 1 has started training (torchrun
  started, torch imported, the rendezvous and init_process_group done).

Times come from the ranks' own notes (epochs.jsonl), the step's record
(``attempts``: our own clocks in the tasks) and, for the end of attempt 0,
Metaflow's time stamp on its own "Task failed." line. (The tasks' other log
lines are stamped when Metaflow reads them, seconds late under load.) Writes
results/resume.json, prints a table, and draws docs/resume.png (the phases) and
docs/card-attempts.png (the card's Attempts table of the last run, as the card
shows it) when matplotlib is there.

    python benchmarks/resume.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FLOW = os.path.join(REPO, "tests", "flows", "checkpoint_flow.py")
RESULTS = os.path.join(HERE, "results")
PHASES = ["detected", "attempt 0 ended", "attempt 1 started", "checkpoint loaded", "call started",
          "gang formed", "first training line"]
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


def one_run(workdir: str) -> Dict[str, object]:
    out = os.path.join(workdir, "out")
    os.makedirs(out)
    env = dict(os.environ, MFTR_TEST_OUT=out, METAFLOW_DATASTORE_SYSROOT_LOCAL=workdir,
               METAFLOW_USER=os.environ.get("METAFLOW_USER", "bench"),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               MFTR_CKPT=json.dumps({"kill-after-epoch": 2, "epochs": 3}))
    started = time.time()
    proc = subprocess.run([sys.executable, FLOW, "--no-pylint", "run"], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError("the flow failed:\n" + log[-3000:])
    with open(os.path.join(out, "epochs.jsonl")) as f:
        events = [json.loads(line) for line in f if line.strip()]
    kill = min(e["t"] for e in events if e["event"] == "kill")
    first_epoch = max(e["t"] for e in events if e["event"] == "start" and e["attempt"] == 1)
    record = json.loads(subprocess.run(
        [sys.executable, "-c",
         "import json; from metaflow import Flow, namespace; namespace(None)\n"
         "t = [t for t in Flow('CheckpointFlow').latest_run['train'] if t.id.isdigit()][0]\n"
         "print(t.metadata_dict['torchrun-result'])"],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=120).stdout.strip().splitlines()[-1])
    second = record["attempts"][1]
    with open(os.path.join(RESULTS, "resume-record.json"), "w") as f:
        json.dump({"attempts": record["attempts"]}, f, indent=1)
    marks = {
        "detected": record["attempts"][0].get("ended_at"),
        "attempt 0 ended": first_line(log, "Task failed.", kill),
        "attempt 1 started": second["started_at"],
        "checkpoint loaded": second.get("code_started_at"),
        "call started": second["calls"][0]["started_at"],
        "gang formed": second.get("gang_formed_at"),
        "first training line": first_epoch,
    }
    phases: Dict[str, Optional[float]] = {}
    before = kill
    for name in PHASES:
        t = marks[name]
        phases[name] = None if t is None else round(t - before, 2)
        before = t if t is not None else before
    return {
        "kill_to_first_training_line_s": round(first_epoch - kill, 2),
        "phases_s": phases,
        "gang_formed_s": second.get("gang_formed_seconds"),
        "lost_work_s": record["attempts"][0].get("lost_work_seconds"),
        "restart_s": record["attempts"][0].get("restart_seconds"),
        "run_s": round(time.time() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--output", default=os.path.join(RESULTS, "resume.json"))
    args = parser.parse_args()
    runs: List[Dict[str, object]] = []
    for i in range(args.repeat):
        workdir = tempfile.mkdtemp(prefix="mftr-resume-")
        try:
            runs.append(one_run(workdir))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        print("run %d: %.1f s from the kill to the first training line of attempt 1"
              % (i + 1, runs[-1]["kill_to_first_training_line_s"]), flush=True)
    totals = sorted(float(r["kill_to_first_training_line_s"]) for r in runs)  # type: ignore[arg-type]
    summary = {
        "what": "node 1 SIGKILLed after epoch 2 of attempt 0 -> first training line of attempt 1 "
                "(2 nodes x 2 processes, gloo, local, @retry(minutes_between_retries=0))",
        "median_s": totals[len(totals) // 2],
        "runs": runs,
        "cpus": os.cpu_count(),
        "load_avg_at_end": os.getloadavg(),
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(summary, f, indent=1)
    print("\n| phase | " + " | ".join("run %d" % (i + 1) for i in range(len(runs))) + " |")
    print("|---|" + "---|" * len(runs))
    for name in PHASES:
        cells = [r["phases_s"].get(name) for r in runs]  # type: ignore[union-attr]
        print("| %s | %s |" % (name, " | ".join("%.1f s" % c if c is not None else "?" for c in cells)))
    print("| **kill -> first training line** | %s |"
          % " | ".join("**%.1f s**" % r["kill_to_first_training_line_s"] for r in runs))
    draw(summary, os.path.join(REPO, "docs"))


def draw(summary: Dict[str, object], docs: str) -> None:
    """The phases of each run as stacked bars, and the card's Attempts table."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no figure (pip install -r benchmarks/requirements.txt)")
        return
    runs = summary["runs"]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.5 * len(runs)))  # type: ignore[arg-type]
    for i, run in enumerate(runs):  # type: ignore[arg-type]
        left = 0.0
        for j, name in enumerate(PHASES):
            width = run["phases_s"].get(name) or 0.0
            ax.barh(i, width, left=left, color=plt.cm.tab10(j), label=name if i == 0 else None)
            left += width
        ax.text(left + 0.2, i, "%.1f s" % left, va="center", fontsize=8)
    ax.set_yticks(range(len(runs)), ["run %d" % (i + 1) for i in range(len(runs))])  # type: ignore[arg-type]
    ax.set_xlabel("seconds from node 1's SIGKILL (attempt 0) to the first training line of attempt 1")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.45))
    fig.tight_layout()
    fig.savefig(os.path.join(docs, "resume.png"), dpi=120)
    plt.close(fig)
    with open(os.path.join(RESULTS, "resume-record.json")) as f:
        attempts = json.load(f)["attempts"]
    import metaflow  # noqa: F401  (the extension loads under it)
    from metaflow_extensions.torchrun.plugins.torchrun.runtime.card import ATTEMPT_HEADERS, attempt_rows
    from metaflow_extensions.torchrun.plugins.torchrun.runtime.result import TorchrunResult

    result = TorchrunResult(command=[], node_index=0, num_nodes=2, nproc_per_node=2, exit_code=0,
                            started_at=0.0, ended_at=0.0, attempts=attempts)
    rows = [[re.sub(r"\\(.)", r"\1", cell) for cell in row] for row in attempt_rows(result)]
    fig, ax = plt.subplots(figsize=(13, 1.4))
    ax.axis("off")
    ax.set_title("Attempts (the @torchrun card, control task)", loc="left", fontsize=10)
    table = ax.table(cellText=rows, colLabels=ATTEMPT_HEADERS, loc="center", cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    table.auto_set_column_width(list(range(len(ATTEMPT_HEADERS))))
    fig.tight_layout()
    fig.savefig(os.path.join(docs, "card-attempts.png"), dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
