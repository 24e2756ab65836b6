"""From a node lost mid-training to the first training step after it, on a real local flow (3 nodes x 2
processes, gloo, DDP, a snapshot every step: tests/flows/lost_node_flow.py): node 1 (with a spare) or
node 2 (with min_nodes=2) has its task and every process of its node SIGKILLed at step 3, as a host
pulled (its connection closes); or node 1 is frozen whole (SIGSTOP of its task and everything below it:
silence, with heartbeat_timeout=5), or its task is SIGTERMed (told to go), each with a spare. The time
is from the loss to the moment every rank of the new start has written a step done (its at-rank file,
polled every 20 ms), so it includes noticing the loss, stopping the others' ranks, the new rendezvous,
the resume from memory and one step (0.2 s of sleep in it).

    .venv/bin/python benchmarks/lost_node.py --runs 3 --json benchmarks/results/lost_node.json
"""

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests"), os.path.join(HERE, "..")]

from tests.integration.helpers import Gang, finish_or_explain  # noqa: E402
from tests.integration.test_lost_nodes import SCRIPT_ARGS, _pull_host, _task_of, _wait_for_step  # noqa: E402
from tests.integration.test_node_departures import HEARTBEAT_TIMEOUT, _freeze  # noqa: E402

# case -> (@torchrun's attributes, the node lost (None: node 1's rank 2 SIGKILLs itself after step 3, its task
# alive: the swap of a failed node's ranks the loss is compared with), the ranks of the start after it, how).
CASES = {"spare": ({"restarts": 2, "spares": 1}, 1, 4, "kill"), "n-1": ({"restarts": 2, "min_nodes": 2}, 2, 4, "kill"),
         "ranks-swap": ({"restarts": 2, "spares": 1}, None, 4, "kill"),
         "silence": ({"restarts": 2, "spares": 1, "heartbeat_timeout": HEARTBEAT_TIMEOUT}, 1, 4, "freeze"),
         "sigterm": ({"restarts": 2, "spares": 1}, 1, 4, "sigterm")}


def _lose(how, run_pid, node):
    if how == "kill":
        _pull_host(run_pid, node)
    elif how == "freeze":
        _freeze(run_pid, node)
    else:
        os.kill(_task_of(run_pid, node), signal.SIGTERM)


def _first_step_after(gang, ranks, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        at = gang.reports("at-rank-")
        new = [r for r in at.values() if r["restart"] >= 1]
        if len(new) >= ranks:
            return time.monotonic()
        time.sleep(0.02)
    raise RuntimeError("no step after the loss: %r" % gang.reports("at-rank-"))


def _any_at(gang, step, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["restart"] == 0 and r["step"] >= step for r in gang.reports("at-rank-").values()):
            return
        time.sleep(0.01)
    raise RuntimeError("no rank reached step %d" % step)


def one(case):
    attrs, node, ranks, how = CASES[case]
    gang = Gang(tempfile.mkdtemp(prefix="lost-bench-"))
    gang.env["MFTR_TORCHRUN_ATTRS"] = json.dumps(attrs)
    script_args = SCRIPT_ARGS + (["--kills", "0:2:3"] if node is None else [])
    proc = gang.start("--nodes", "3", "--script-args", json.dumps(script_args), flow="lost_node_flow.py")
    try:
        if node is None:  # rank 2 dies after step 3, once every rank saved it: the others write it then
            _any_at(gang, 3)
        else:
            _wait_for_step(gang, 4, 3, poll=0.01)
        killed = time.monotonic()
        if node is not None:
            _lose(how, proc.pid, node)
        took = _first_step_after(gang, ranks) - killed
        finish_or_explain(proc, gang, 300)
        assert proc.returncode == 0
        return took
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        gang.kill_everything()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--cases", default=",".join(CASES))
    args = p.parse_args()
    results = {}
    if args.json and os.path.exists(args.json):
        with open(args.json) as f:
            results = json.load(f)["results"]
    for case in args.cases.split(","):
        times = [one(case) for _ in range(args.runs)]
        results[case] = {"seconds": [round(t, 2) for t in times], "median": round(statistics.median(times), 2)}
        print(case, results[case], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpus": os.cpu_count(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
