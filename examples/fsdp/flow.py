"""FSDP2 training that resumes from memory after a failure (docs/resume.md, "Resuming from memory").

A small model sharded with FSDP2 (`fully_shard`) on 2 nodes x 2 processes, on CPU (gloo) or GPUs
(NCCL). Every step each rank keeps its shard of the model and of Adam's state in its node's memory
(`save(step, state, replicated=False)`); with `restarts=1` a failed rank restarts the gang inside the
step, and every rank resumes at the step it last saved: no checkpoint read, no step trained twice.

    python flow.py run                        # trains 12 steps
    python flow.py run --kill-at-step 6       # rank 3 dies after step 6; the gang restarts and resumes
                                              # at step 6 from memory, and ends with the same state
                                              # (its digest) as the run above
"""

import json
import os
import tempfile

from metaflow import FlowSpec, Parameter, current, step, torchrun


class FSDPTrain(FlowSpec):
    steps = Parameter("steps", default=12, help="training steps")
    kill_at_step = Parameter("kill-at-step", default=0, help="rank 3 dies after this step (first start only)")

    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @torchrun(nproc_per_node=2, restarts=1)
    @step
    def train(self):
        metrics = os.path.join(tempfile.mkdtemp(), "metrics.json")
        args = {"steps": self.steps, "metrics-out": metrics}
        if self.kill_at_step:
            args["kill-at-step"] = self.kill_at_step
        current.torch.run(entrypoint="train.py", entrypoint_args=args)
        # Global rank 0 runs on node 0, so the file it wrote is on this node's disk.
        if current.parallel.node_index == 0:
            with open(metrics) as f:
                self.metrics = json.load(f)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.metrics = next(i.metrics for i in inputs if hasattr(i, "metrics"))
        print("resumed from step %s; loss %.4f; state %s" % (
            self.metrics["resumed_from"], self.metrics["loss"], self.metrics["state_sha256"][:16]))
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    FSDPTrain()
