"""The flow of benchmarks/snapshot_resume.py: one @torchrun step on --nodes nodes of 2 processes that
runs benchmarks/scripts/snapshot_bench_train.py with --script-args (a JSON list). The decorator's
attributes come from $BENCH_TORCHRUN_ATTRS (JSON): restarts, spares, snapshots."""

import json
import os

from metaflow import FlowSpec, Parameter, step, torchrun

SCRIPT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "scripts",
                                       "snapshot_bench_train.py"))


class BenchSnapshotFlow(FlowSpec):
    nodes = Parameter("nodes", default=2)
    script_args = Parameter("script-args", default="[]", help="JSON list")

    @step
    def start(self):
        self.next(self.train, num_parallel=self.nodes)

    @torchrun(**json.loads(os.environ.get("BENCH_TORCHRUN_ATTRS", "{}")))
    @step
    def train(self):
        from metaflow import current

        current.torch.run(entrypoint=SCRIPT, entrypoint_args=json.loads(self.script_args), nproc_per_node=2)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    BenchSnapshotFlow()
