"""Rendezvous join time: torch's static rendezvous (what @torchrun uses unless
max_restarts is above 0) against c10d's dynamic one (used with restarts).

N torchrun agents (one process each) start at once on this host with the options
@torchrun's command building gives them (launch/command.py, through rank/agent.py);
each rank writes the time it started. Join time = the last rank's start minus the
time the first agent reached torch's rendezvous (the agents' ``import torch`` is
the same for both and left out). Results go to benchmarks/results/rendezvous.json.

    python benchmarks/rendezvous.py [--nodes 2 4 8] [--repeat 3]
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
    f.write(repr(time.time()))
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


def one_run(nodes: int, restarts: bool, workdir: str) -> float:
    out = tempfile.mkdtemp(dir=workdir)
    script = os.path.join(out, "rank.py")
    shim = os.path.join(out, "shim.py")
    with open(script, "w") as f:
        f.write(RANK_SCRIPT)
    with open(shim, "w") as f:
        f.write(AGENT_SHIM)
    port = free_port()
    procs = []
    for index in range(nodes):
        launch = Launch(
            python=sys.executable, num_nodes=nodes, node_index=index, nproc_per_node=1,
            rdzv_host="127.0.0.1", rdzv_port=port, rdzv_id="bench-%d" % port, entrypoint=script,
            user_options={"max-restarts": "1"} if restarts else {}, local_addr="127.0.0.1",
            start_timeout=60,
        )
        argv = [sys.executable, shim, AGENT_MODULE] + options_to_argv(default_options(launch)) + [script, out]
        procs.append(subprocess.Popen(argv, env=dict(os.environ, BENCH_OUT=out),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for p in procs:
        if p.wait(timeout=300) != 0:
            raise RuntimeError("an agent failed (nodes=%d, restarts=%s)" % (nodes, restarts))
    times = {name: float(open(os.path.join(out, name)).read()) for name in os.listdir(out)
             if name.startswith(("agent-", "rank-"))}
    agents = [t for n, t in times.items() if n.startswith("agent-")]
    ranks = [t for n, t in times.items() if n.startswith("rank-")]
    assert len(ranks) == nodes, times
    return max(ranks) - min(agents)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    results: Dict[str, Dict[str, List[float]]] = {"static": {}, "c10d": {}}
    with tempfile.TemporaryDirectory() as workdir:
        for nodes in args.nodes:
            for name, restarts in (("static", False), ("c10d", True)):
                runs = [one_run(nodes, restarts, workdir) for _ in range(args.repeat)]
                results[name][str(nodes)] = [round(r, 3) for r in runs]
                print("%-6s %2d nodes: median %.2f s  (%s)" % (name, nodes, statistics.median(runs), runs))
    record = {
        "what": "rendezvous join time: last rank started - first agent reached torch's rendezvous "
                "(seconds, one process per node, all on this host)",
        "cpus": os.cpu_count(),
        "results": results,
    }
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "rendezvous.json"), "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
