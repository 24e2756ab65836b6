"""One current.torch.run call whose keyword arguments come from the environment.

MFTR_CALL: a JSON object of current.torch.run's keywords (entrypoint relative to
this file's scripts/ unless null). MFTR_TORCHRUN: the step's @torchrun attributes
(a JSON object, default none). MFTR_SLOW_NODE: a node that does not make its
call until the gang stops it (the other node's call refused is the gang's root
cause; at most 120 s). The step stores the result's nproc_per_node as an artifact.
"""

import contextlib
import json
import os
import time

from metaflow import FlowSpec, current, step, torchrun

HERE = os.path.dirname(os.path.abspath(__file__))


class CallFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @torchrun(**json.loads(os.environ.get("MFTR_TORCHRUN", "{}")))
    @step
    def train(self):
        kwargs = json.loads(os.environ.get("MFTR_CALL", "{}"))
        if kwargs.get("entrypoint"):
            kwargs["entrypoint"] = os.path.join("scripts", kwargs["entrypoint"])
        if current.parallel.node_index == int(os.environ.get("MFTR_SLOW_NODE", "-1")):
            # A barrier on the event itself: the gang's abort interrupts this
            # wait (GangAborted), so the other node's refusal comes first.
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                time.sleep(0.1)
        with contextlib.chdir(HERE):  # the entrypoint is looked up from there; back after (refusals_flow.py)
            result = current.torch.run(**kwargs)
        self.nproc = result.nproc_per_node
        self.next(self.join)

    @step
    def join(self, inputs):
        self.nprocs = [i.nproc for i in inputs]
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    CallFlow()
