"""A @torchrun step with the attributes named by $MFTR_MISUSE, for refusal tests."""

import os

from metaflow import FlowSpec, current, step, torchrun

ATTRIBUTES = {
    "nproc_zero": {"nproc_per_node": 0},
    "nproc_negative": {"nproc_per_node": -2},
    "nproc_type": {"nproc_per_node": "many"},
    "nproc_float": {"nproc_per_node": 1.5},
    "unknown_attribute": {"nprocs": 2},
    "unknown_torchrun_option": {"torchrun_args": {"max_restart": 1}},
    "torchrun_args_type": {"torchrun_args": "--max-restarts 1"},
    "nproc_too_many": {"nproc_per_node": 100000},
    "heartbeat_too_short": {"heartbeat_timeout": 0.01},
    "retry_on_with_max_restarts": {"retry_on": "infrastructure", "torchrun_args": {"max_restarts": 2}},
    "spares_without_restarts": {"spares": 1},
    "spares_leave_no_node": {"spares": 2, "restarts": 1},
}[os.environ["MFTR_MISUSE"]]


class MisuseFlow(FlowSpec):
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
    MisuseFlow()
