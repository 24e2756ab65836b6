"""A @torchrun step on a cluster, for tests/multihost/test_submitted.py, which
captures what Metaflow would submit for it (no cluster is contacted).

MFTR_SUBMIT_PLATFORM picks the compute decorator of ``train`` ("kubernetes" or
"batch"), MFTR_SUBMIT_ATTRS (JSON) its attributes, MFTR_SUBMIT_RESOURCES (JSON,
optional) adds ``@resources(...)`` above it, MFTR_SUBMIT_NODES is num_parallel,
MFTR_SUBMIT_TORCHRUN (JSON, optional) is ``@torchrun``'s attributes.
The body of ``train`` never runs in those tests.
"""

import json
import os

from metaflow import FlowSpec, batch, current, kubernetes, resources, step, torchrun

PLATFORM = os.environ.get("MFTR_SUBMIT_PLATFORM", "kubernetes")
ATTRS = json.loads(os.environ.get("MFTR_SUBMIT_ATTRS", '{"gpu": 2}'))
RESOURCES = json.loads(os.environ.get("MFTR_SUBMIT_RESOURCES", "null"))
NODES = int(os.environ.get("MFTR_SUBMIT_NODES", "2"))
TORCHRUN = json.loads(os.environ.get("MFTR_SUBMIT_TORCHRUN", "{}"))  # @torchrun's attributes
compute = {"kubernetes": kubernetes, "batch": batch}[PLATFORM]


def _maybe_resources(func):
    return resources(**RESOURCES)(func) if RESOURCES else func


class SubmitFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=NODES)

    @_maybe_resources
    @compute(**ATTRS)
    @torchrun(**TORCHRUN)
    @step
    def train(self):
        current.torch.run(entrypoint="train.py")
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    SubmitFlow()
