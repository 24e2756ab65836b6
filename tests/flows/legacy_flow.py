"""Code written for metaflow-torchrun 0.2, selected by $MFTR_LEGACY."""

import os

from metaflow import FlowSpec, current, step, torchrun

CASE = os.environ["MFTR_LEGACY"]
ATTRIBUTES = {
    # 0.2's attribute names: aliases, with one deprecation line each.
    "aliases": {"master_port": os.environ.get("MFTR_PORT", "0"), "all_nodes_started_timeout": 120},
    # Options @torchrun owns, one with an empty value: refused at flow start in
    # one message, naming the @torchrun way for each (not "write True").
    "owned": {"torchrun_args": {"no_python": "", "nnodes": 2}},
    # 0.2's way to pin its port: torchrun's rendezvous port, one deprecation line.
    "step_master_port": {"torchrun_args": {"master_port": os.environ.get("MFTR_PORT", "0")}},
    # Everything wrong at once: one run, one message naming each problem.
    "problems": {
        "nproc_per_node": 0,
        "torchrun_args": {"no_python": "", "max_restarts": "", "bogus_option": 1},
        "port": "x",
        "heartbeat_timeout": -1,
        "args_as": "0.3",
        "nprocs": 2,
    },
    # Calls as 0.1/0.2 wrote them (CALLS below).
    "call_master_port": {},
    "positional": {},
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
        if CASE == "call_master_port":
            current.torch.run(entrypoint="scripts/report.py", master_port=41000)  # metaflow-torchrun 0.1
        elif CASE == "positional":
            current.torch.run({"max_restarts": 0}, "scripts/report.py")  # 0.2's order
        else:
            result = current.torch.run(entrypoint="scripts/report.py")
            self.rdzv_port = result.rdzv_port
        self.next(self.join)

    @step
    def join(self, inputs):
        self.ports = [getattr(i, "rdzv_port", None) for i in inputs]
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    LegacyFlow()
