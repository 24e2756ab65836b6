"""Variant A: the benchmark job under ``@torchrun``.

Same graph, parameters and script as ``manual_flow.py``; only the ``train`` step
differs. ``@torchrun`` attributes (heartbeat_timeout, ...) come from the
environment variable BENCH_TORCHRUN_ATTRS (JSON), since decorators are set when
the flow file is imported.
"""

import json
import os

from metaflow import FlowSpec, Parameter, current, step, torchrun

SCRIPTS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "scripts"))


class BenchTorchrunFlow(FlowSpec):
    script = Parameter("script", default="trivial.py", help="under benchmarks/scripts; none: no job")
    script_args = Parameter("script-args", default="[]", help="JSON list: the script's argv")
    nodes = Parameter("nodes", default=2)
    nproc = Parameter("nproc", default=2)
    port = Parameter("port", default=0, help="unused here (@torchrun picks its own)")

    @step
    def start(self):
        self.next(self.train, num_parallel=self.nodes)

    @torchrun(**json.loads(os.environ.get("BENCH_TORCHRUN_ATTRS") or "{}"))
    @step
    def train(self):
        if self.script == "none":  # the Metaflow floor: the same flow, no job
            self.next(self.join)
            return
        current.torch.run(
            entrypoint=os.path.join(SCRIPTS, self.script),
            entrypoint_args=json.loads(self.script_args),
            nproc_per_node=self.nproc,
        )
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    BenchTorchrunFlow()
