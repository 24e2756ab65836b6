"""Real nodes, as many as this machine holds (issue 24, item 6): a real local
Metaflow flow (flows/torchrun_flow.py) with N nodes x 1 process under
@torchrun, gloo on CPU, running scripts/allreduce.py, in three cases:

- hello: every rank all-reduces a one and leaves (the run succeeds);
- rank_failure: the rank of node --fail-node raises once every rank has
  all-reduced (it notes the time just before, in crash.json);
- node_killed: once every rank has all-reduced (so node --fail-node's rank has
  printed its lines), that node's Metaflow task process is SIGKILLed.

For each run: the wall time of ``flow.py run``; the time from its start to
every rank's first line, read from the console (the ranks' lines are labelled
``[rankN]:``; the runtime stamps each line when it shows it) and, from the same
lines, each rank's own clock right after init_process_group (BENCHREADY; all on
one host, so one clock); for the failures,
the time from the injection to the end of ``flow.py run`` and whether the
failure's root-cause line names the right node (and, for a rank failure, the
right rank). After each run, any process of the run still alive (found by the
sandbox's token) is reported, then killed. Every run is bounded (--timeout).
A benchmark: it asserts nothing about time.

    python benchmarks/real_nodes.py [--nodes 16] [--repeat 1] [--cases hello,rank_failure,node_killed]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _lib import (  # noqa: E402
    READY_RE,
    RESULTS,
    Sandbox,
    _console_time,
    cmdline,
    machine_info,
    median,
    node_task,
    processes_with_token,
    versions,
    write_json,
)

CASES = ("hello", "rank_failure", "node_killed")
MODES = {"hello": "hello", "rank_failure": "raise", "node_killed": "spin"}

# "2026-11-23 18:34:01.558 [run/train/2 (pid 29997)] [rank1]: ..."
RANK_LINE_RE = re.compile(rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) \[[^\]]*\] \[rank(\d+)\]: ")
TRAIN_START_RE = re.compile(rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) \[[^/\]]+/train/[^\]]*\] Task is starting")


def first_rank_lines(console: str) -> Dict[int, float]:
    """Each rank's first labelled line on the console: the runtime's timestamp."""
    found: Dict[int, float] = {}
    with open(console, "rb") as f:
        for line in f:
            m = RANK_LINE_RE.match(line)
            if m:
                found.setdefault(int(m.group(2)), _console_time(m.group(1)))
    return found


def rank_ready_times(console: str) -> Dict[int, float]:
    """Each rank's own time.time() right after init_process_group (its BENCHREADY
    line): when the rank got going, whenever the console showed it."""
    found: Dict[int, float] = {}
    with open(console, "rb") as f:
        for line in f:
            m = READY_RE.search(line)
            if m:
                found.setdefault(int(m.group(1)), float(m.group(3)))
    return found


def train_started(console: str) -> Optional[float]:
    with open(console, "rb") as f:
        for line in f:
            m = TRAIN_START_RE.match(line)
            if m:
                return _console_time(m.group(1))
    return None


CONSOLE_PREFIX_RE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \[[^\]]*\] ?")


def root_cause(text: str) -> Optional[str]:
    """The failure's root-cause line, without the runtime's prefix."""
    lines = [line for line in text.splitlines() if "Root cause:" in line]
    return CONSOLE_PREFIX_RE.sub("", lines[0]) if lines else None


def names(line: Optional[str], what: str, index: int) -> bool:
    return bool(line) and re.search(r"\b%s %d\b" % (what, index), line) is not None  # type: ignore[arg-type]


def _wait(predicate, proc, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return predicate()
        time.sleep(0.05)
    return False


def _ready_count(out: str) -> int:
    return sum(name.startswith("ready-") for name in os.listdir(out))


def _leftovers(token: str, grace: float) -> List[str]:
    """What of the run is still alive ``grace`` seconds after flow.py run ended."""
    deadline = time.monotonic() + grace
    left = processes_with_token(token)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_with_token(token)
    return ["%d: %s" % (pid, cmdline(pid)[:200].decode(errors="replace")) for pid in left]


def _inject(case: str, proc, box: Sandbox, nodes: int, fail_node: int, timeout: float) -> Optional[float]:
    """Wait for the gang, then inject the failure; the injection's time.time()."""
    if case == "hello":
        return None
    if not _wait(lambda: _ready_count(box.out) >= nodes, proc, timeout):
        raise RuntimeError("only %d of %d ranks got ready" % (_ready_count(box.out), nodes))
    if case == "rank_failure":
        path = os.path.join(box.out, "crash.json")
        if not _wait(lambda: os.path.exists(path), proc, 60):
            raise RuntimeError("rank %d never reported its failure" % fail_node)
        with open(path) as f:
            return float(json.load(f)["time"])
    task = node_task(proc.pid, fail_node)
    if task is None:
        raise RuntimeError("no task process for node %d" % fail_node)
    injected = time.time()
    os.kill(task, signal.SIGKILL)
    return injected


def one(case: str, nodes: int, fail_node: int, timeout: float, attrs: Dict[str, object]) -> Dict[str, object]:
    row: Dict[str, object] = {"case": case, "nodes": nodes, "nproc_per_node": 1,
                              "load1_before": round(os.getloadavg()[0], 2)}
    with Sandbox() as box:
        args = ["--mode", MODES[case], "--rank", str(fail_node if case == "rank_failure" else -1)]
        proc, console, started = box.start(
            "torchrun", {"script": "allreduce.py", "script_args": args, "nodes": nodes, "nproc": 1},
            env={"BENCH_TORCHRUN_ATTRS": json.dumps(attrs)} if attrs else None)
        injected = error = None
        try:
            injected = _inject(case, proc, box, nodes, fail_node, timeout)
            proc.wait(timeout=max(1.0, started + timeout - time.time()))
        except Exception as e:  # a broken or hung run is reported, not fatal
            error = "%s: %s" % (type(e).__name__, e)
        ended = time.time()
        timed_out = proc.poll() is None
        row["leftover_processes"] = [] if timed_out else _leftovers(box.token, 10.0)
        box.kill_everything(proc)
        row["load1_after"] = round(os.getloadavg()[0], 2)
        row.update(_measures(case, console, started, ended, injected, nodes, fail_node))
        row.update({"returncode": proc.returncode, "timed_out": timed_out, "error": error})
    return row


def _measures(case: str, console: str, started: float, ended: float, injected: Optional[float],
              nodes: int, fail_node: int) -> Dict[str, object]:
    firsts = first_rank_lines(console)
    train = train_started(console)
    since_start = {r: round(t - started, 3) for r, t in sorted(firsts.items())}
    ready = {r: round(t - started, 3) for r, t in sorted(rank_ready_times(console).items())}
    with open(console, errors="replace") as f:
        text = f.read()
    cause = root_cause(text)
    out: Dict[str, object] = {
        "wall_s": round(ended - started, 3),
        "train_step_started_s": None if train is None else round(train - started, 3),
        "ranks_seen": len(firsts),
        "first_line_s": since_start,
        "first_line_s_min": min(since_start.values(), default=None),
        "first_line_s_median": median(list(since_start.values())),
        "first_line_s_max": max(since_start.values(), default=None),
        "rank_ready_s": ready,
        "rank_ready_s_min": min(ready.values(), default=None),
        "rank_ready_s_max": max(ready.values(), default=None),
        "console_lag_s_max": max([firsts[r] - started - t for r, t in ready.items() if r in firsts],
                                 default=None),
        "console_lines": text.count("\n"),
        "console_tail": text[-1500:],
    }
    if case != "hello":
        out.update({
            "injection_to_end_s": None if injected is None else round(ended - injected, 3),
            "root_cause": cause[:600] if cause else None,
            "names_node": names(cause, "node", fail_node),
            "names_rank": names(cause, "rank", fail_node) if case == "rank_failure" else None,
        })
    return out


def summary(rows: List[Dict[str, object]]) -> Dict[str, Dict[str, object]]:
    out: Dict[str, Dict[str, object]] = {}
    for case in CASES:
        mine = [r for r in rows if r["case"] == case]
        if not mine:
            continue
        ok = [r for r in mine if not r["timed_out"] and not r["error"]]

        def med(key):
            return median([r.get(key) for r in ok])  # type: ignore[misc]

        out[case] = {
            "runs": len(mine), "completed": len(ok),
            "returncodes": [r["returncode"] for r in mine],
            "wall_s": med("wall_s"), "first_line_s_max": med("first_line_s_max"),
            "first_line_s_min": med("first_line_s_min"),
            "rank_ready_s_min": med("rank_ready_s_min"), "rank_ready_s_max": med("rank_ready_s_max"),
            "console_lines": med("console_lines"),
            "injection_to_end_s": med("injection_to_end_s"),
            "names_right_node": sum(1 for r in ok if r.get("names_node")),
            "names_right_rank": sum(1 for r in ok if r.get("names_rank")),
            "leftovers": sum(len(r["leftover_processes"]) for r in mine),  # type: ignore[arg-type]
            "load1": [r["load1_before"] for r in mine],
        }
    return out


def table(result: Dict[str, object]) -> str:
    def f(v):
        return "-" if v is None else "%.1f s" % v

    lines = ["| case | runs (rc) | flow.py run wall | start -> ranks ready, own clock (first / last) "
             "| start -> first rank line on console (first / last) "
             "| injection -> end | names node / rank | console lines | leftovers | load (1 min) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for case, s in result["summary"].items():  # type: ignore[union-attr]
        named = "-" if case == "hello" else "%d/%d%s" % (
            s["names_right_node"], s["completed"],
            " / %d/%d" % (s["names_right_rank"], s["completed"]) if case == "rank_failure" else "")
        lines.append("| %s | %d (%s) | %s | %s / %s | %s / %s | %s | %s | %s | %d | %s |" % (
            case, s["runs"], ",".join(str(c) for c in s["returncodes"]), f(s["wall_s"]),
            f(s["rank_ready_s_min"]), f(s["rank_ready_s_max"]),
            f(s["first_line_s_min"]), f(s["first_line_s_max"]), f(s["injection_to_end_s"]),
            named, "-" if s["console_lines"] is None else "%d" % s["console_lines"],
            s["leftovers"], ", ".join("%.0f" % x for x in s["load1"])))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--fail-node", type=int, default=9)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run, then it is killed")
    ap.add_argument("--torchrun-attrs", default="{}", help="JSON: @torchrun attributes")
    ap.add_argument("--out", default=os.path.join(RESULTS, "real_nodes.json"))
    args = ap.parse_args()
    if not 0 < args.fail_node < args.nodes:
        ap.error("--fail-node must be a node other than 0, below --nodes")
    attrs = json.loads(args.torchrun_attrs)
    rows = []
    for case in [c for c in args.cases.split(",") if c]:
        if case not in CASES:
            ap.error("unknown case %r (one of %s)" % (case, ", ".join(CASES)))
        for i in range(args.repeat):
            row = one(case, args.nodes, args.fail_node, args.timeout, attrs)
            rows.append(row)
            print("%s %d/%d: rc=%s wall %.1f s, last first line %s s, injection->end %s s, "
                  "cause %r, leftovers %d, load %.0f%s" % (
                      case, i + 1, args.repeat, row["returncode"], row["wall_s"], row["first_line_s_max"],
                      row.get("injection_to_end_s"), row.get("root_cause"), len(row["leftover_processes"]),
                      row["load1_before"], "  ERROR " + str(row["error"]) if row["error"] else ""),
                  file=sys.stderr, flush=True)
    result = {"what": __doc__.split("\n\n")[0], "machine": machine_info(), "versions": versions(),
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "torchrun_attrs": attrs,
              "fail_node": args.fail_node, "timeout_s": args.timeout, "runs": rows}
    result["summary"] = summary(rows)
    write_json(args.out, result)
    print(table(result))


if __name__ == "__main__":
    main()
