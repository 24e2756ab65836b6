"""One flow for the integration tests: which script runs, with which arguments,
on how many nodes and processes, all come from parameters."""

import json
import os
import sys
import time

from metaflow import FlowSpec, Parameter, current, step, torchrun

if " card create " in " ".join(sys.argv) and os.environ.get("MFTR_TEST_OUT"):
    # Metaflow's card subprocess imports this file: the tests count them.
    with open(os.path.join(os.environ["MFTR_TEST_OUT"], "card-create.log"), "a") as f:
        f.write(" ".join(sys.argv) + "\n")


class GangFlow(FlowSpec):
    script = Parameter("script", default="report.py")
    script_args = Parameter("script-args", default="null", help="JSON list or dict")
    nodes = Parameter("nodes", default=2)
    nproc = Parameter("nproc", default=2, help="0: do not pass nproc_per_node")
    torchrun_args = Parameter("torchrun-args", default="null", help="JSON")

    @step
    def start(self):
        self.next(self.train, num_parallel=self.nodes)

    @torchrun(**json.loads(os.environ.get("MFTR_TORCHRUN_ATTRS", "{}")))
    @step
    def train(self):
        if str(current.parallel.node_index) == os.environ.get("MFTR_SKIP_NODE"):
            time.sleep(3600)  # this node "never starts" its torchrun
        result = current.torch.run(
            entrypoint=os.path.join("scripts", self.script),
            entrypoint_args=json.loads(self.script_args),
            nproc_per_node=self.nproc or None,
            torchrun_args=json.loads(self.torchrun_args),
        )
        self.node_index = current.parallel.node_index
        self.exit_code = result.exit_code
        self.next(self.join)

    @step
    def join(self, inputs):
        self.node_indices = sorted(i.node_index for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    GangFlow()
