"""Code written for metaflow-torchrun 0.2, selected by $MFTR_LEGACY."""

import os

from metaflow import FlowSpec, current, step, torchrun

CASE = os.environ["MFTR_LEGACY"]
ATTRIBUTES = {
    # 0.2's attribute names: aliases, with one deprecation line each.
    "aliases": {"master_port": os.environ.get("MFTR_PORT", "0"), "all_nodes_started_timeout": 120},
    # An option @torchrun owns: refused at flow start, naming the @torchrun way.
    "owned": {"torchrun_args": {"master_port": "41000"}},
    # 0.2's list form of torchrun_args.
    "pairs": {"torchrun_args": ["nproc_per_node", 1, "max_restarts", 0]},
}[CASE]


class LegacyFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @torchrun(**ATTRIBUTES)
    @step
    def train(self):
        current.torch.run(entrypoint="scripts/report.py")
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    LegacyFlow()
