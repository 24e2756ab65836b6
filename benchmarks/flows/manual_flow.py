"""Variant B: the same job with torchrun launched by hand, as a user would write
it without ``@torchrun``: a plain ``@parallel`` step that computes the rendezvous
from ``current.parallel`` and runs ``python -m torch.distributed.run``.

Locally Metaflow's control task starts the other nodes itself before running its
own step, so the port cannot be chosen in the step and handed over: it is a
parameter (the benchmark passes a free one) or, when 0, derived from the run id,
which every node knows. The control node hosts the c10d store (``is_host=1``);
the others only connect to it (``is_host=0``), whatever order they start in.
"""

import hashlib
import json
import os
import subprocess
import sys

from metaflow import FlowSpec, Parameter, current, parallel, step

SCRIPTS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "scripts"))


class BenchManualFlow(FlowSpec):
    script = Parameter("script", default="trivial.py", help="under benchmarks/scripts; none: no job")
    script_args = Parameter("script-args", default="[]", help="JSON list: the script's argv")
    nodes = Parameter("nodes", default=2)
    nproc = Parameter("nproc", default=2)
    port = Parameter("port", default=0, help="rendezvous port; 0: derived from the run id")

    @step
    def start(self):
        self.next(self.train, num_parallel=self.nodes)

    @parallel
    @step
    def train(self):
        if self.script == "none":  # the Metaflow floor: the same flow, no job
            self.next(self.join)
            return
        node = current.parallel
        port = self.port or 20000 + int(hashlib.sha256(current.run_id.encode()).hexdigest(), 16) % 10000
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(node.num_nodes),
            "--nproc-per-node", str(self.nproc),
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", "%s:%d" % (node.main_ip, port),
            "--rdzv-id", "%s-%s" % (current.flow_name, current.run_id),
            "--rdzv-conf", "is_host=%d" % (1 if node.node_index == 0 else 0),
            os.path.join(SCRIPTS, self.script),
        ] + json.loads(self.script_args)
        subprocess.run(cmd, check=True)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    BenchManualFlow()
