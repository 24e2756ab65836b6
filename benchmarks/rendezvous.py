"""Rendezvous join time: torch's static rendezvous (what @torchrun uses unless
max_restarts is above 0) against c10d's dynamic one (used with restarts).

N torchrun agents (one process each) start at once on this host with the options
@torchrun's command building gives them (launch/command.py, through procs/agent.py);
each rank writes the time it started and the node index of its agent. Join time =
the last rank's start minus the time the first agent reached torch's rendezvous
(the agents' ``import torch`` is the same for both and left out). Each run also
records whether global rank r landed on node r (static: always, by --node-rank;
c10d: in whatever order the agents joined) and the 1-minute load average. The
backends alternate run by run, so a change of load hits both alike. Every run is
bounded (--timeout); agents still alive then are killed and the run is an error.
Results are merged into benchmarks/results/rendezvous.json (other sizes are kept).

    python benchmarks/rendezvous.py [--nodes 2 4 8 16] [--repeat 3] [--timeout 300]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import metaflow  # noqa: E402,F401  (first: the extension's modules import it)
from metaflow_extensions.torchrun.plugins.torchrun.launch.command import (  # noqa: E402
    AGENT_MODULE, Launch, default_options, options_to_argv,
)

RANK_SCRIPT = """
import os, sys, time
with open(os.path.join(sys.argv[1], "rank-%s" % os.environ["RANK"]), "w") as f:
    f.write("%r %s" % (time.time(), os.environ["BENCH_NODE"]))
"""

# Runs in each agent before torch's main: when it reached the rendezvous.
AGENT_SHIM = """
import os, sys, time, runpy
import torch.distributed.run  # noqa: F401  (the import is not the rendezvous)
with open(os.path.join(os.environ["BENCH_OUT"], "agent-%d" % os.getpid()), "w") as f:
    f.write(repr(time.time()))
runpy.run_module(sys.argv.pop(1), run_name="__main__")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(nodes: int, restarts: bool, workdir: str, timeout: float) -> Dict[str, object]:
    out = tempfile.mkdtemp(dir=workdir)
    script = os.path.join(out, "rank.py")
    shim = os.path.join(out, "shim.py")
    with open(script, "w") as f:
        f.write(RANK_SCRIPT)
    with open(shim, "w") as f:
        f.write(AGENT_SHIM)
    port = free_port()
    load1 = round(os.getloadavg()[0], 2)
    procs: List[subprocess.Popen] = []
    try:
        for index in range(nodes):
            launch = Launch(
                python=sys.executable, num_nodes=nodes, node_index=index, nproc_per_node=1,
                rdzv_host="127.0.0.1", rdzv_port=port, rdzv_id="bench-%d" % port, entrypoint=script,
                user_options={"max-restarts": "1"} if restarts else {}, local_addr="127.0.0.1",
                start_timeout=60,
            )
            argv = [sys.executable, shim, AGENT_MODULE] + options_to_argv(default_options(launch)) + [script, out]
            procs.append(subprocess.Popen(argv, env=dict(os.environ, BENCH_OUT=out, BENCH_NODE=str(index)),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + timeout
        for p in procs:
            if p.wait(timeout=max(0.1, deadline - time.monotonic())) != 0:
                raise RuntimeError("an agent failed (nodes=%d, restarts=%s)" % (nodes, restarts))
    finally:
        for p in procs:  # bounded: nothing outlives its run
            if p.poll() is None:
                p.kill()
                p.wait()
    agents, ranks, node_of = [], [], {}
    for name in os.listdir(out):
        with open(os.path.join(out, name)) as f:
            text = f.read().split()
        if name.startswith("agent-"):
            agents.append(float(text[0]))
        elif name.startswith("rank-"):
            ranks.append(float(text[0]))
            node_of[int(name[len("rank-"):])] = int(text[1])
    if len(ranks) != nodes:
        raise RuntimeError("%d of %d ranks started" % (len(ranks), nodes))
    return {"join_s": round(max(ranks) - min(agents), 3), "load1": load1,
            "rank0_on_node0": node_of.get(0) == 0,
            "ranks_in_node_order": all(node_of[r] == r for r in range(nodes))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "rendezvous.json"))
    args = parser.parse_args()
    try:
        with open(args.out) as f:
            record = json.load(f)
    except (OSError, ValueError):
        record = {}
    results = record.setdefault("results", {"static": {}, "c10d": {}})
    detail = record.setdefault("runs", {})
    with tempfile.TemporaryDirectory() as workdir:
        for nodes in args.nodes:
            runs: Dict[str, List[Dict[str, object]]] = {"static": [], "c10d": []}
            for _ in range(args.repeat):
                for name, restarts in (("static", False), ("c10d", True)):
                    try:
                        runs[name].append(one_run(nodes, restarts, workdir, args.timeout))
                    except Exception as e:  # reported, not fatal
                        runs[name].append({"error": "%s: %s" % (type(e).__name__, e)})
                    print("%-6s %2d nodes: %s" % (name, nodes, runs[name][-1]), flush=True)
            for name, mine in runs.items():
                joins = [r["join_s"] for r in mine if "join_s" in r]
                results.setdefault(name, {})[str(nodes)] = joins
                detail.setdefault(str(nodes), {})[name] = mine
                if joins:
                    print("%-6s %2d nodes: median %.2f s (%s)" % (name, nodes, statistics.median(joins), joins))
            detail[str(nodes)]["date"] = time.strftime("%Y-%m-%d %H:%M:%S")
    record.update({
        "what": "rendezvous join time: last rank started - first agent reached torch's rendezvous "
                "(seconds, one process per node, all on this host)",
        "cpus": os.cpu_count(),
    })
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
