"""Resume a failed gang from its last checkpoint (docs/resume.md).

The pattern of Outerbounds' cifar_distributed example, on CPU: @retry reruns
the gang, @checkpoint loads the last checkpoint the ranks saved, and the
training script resumes from it. Needs `pip install metaflow-torchrun[checkpoint]`.

    python flow.py run                       # trains 6 epochs
    python flow.py run --fail-at-epoch 3     # node 1's task dies after epoch 3;
                                             # attempt 1 resumes from epoch 3
"""

import json
import os
import tempfile

from metaflow import FlowSpec, Parameter, checkpoint, current, retry, step, torchrun


class CheckpointedTrain(FlowSpec):
    epochs = Parameter("epochs", default=6)
    fail_at_epoch = Parameter("fail-at-epoch", default=0, help="kill node 1 after this epoch (attempt 0)")

    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    # retry_on="infrastructure": a lost node is retried, a bug in train.py is not.
    @retry(times=2, minutes_between_retries=0)
    @checkpoint
    @torchrun(nproc_per_node=2, retry_on="infrastructure")
    @step
    def train(self):
        args = {"epochs": self.epochs, "metrics-out": os.path.join(tempfile.mkdtemp(), "metrics.json")}
        if current.checkpoint.is_loaded:
            args["resume-from"] = current.checkpoint.directory
        if self.fail_at_epoch and current.retry_count == 0 and current.parallel.node_index == 1:
            args["die-after-epoch"] = self.fail_at_epoch  # a stand-in for a lost machine
            args["task-pid"] = os.getpid()
        current.torch.run(entrypoint="train.py", entrypoint_args=args)
        # Global rank 0 runs on node 0 (@torchrun's static rendezvous), so the
        # file rank 0 wrote is on this node's disk: read it here, on node 0.
        if current.parallel.node_index == 0:
            with open(args["metrics-out"]) as f:
                self.metrics = json.load(f)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.metrics = next(i.metrics for i in inputs if hasattr(i, "metrics"))
        print("resumed from epoch %s, final loss %.4f" % (self.metrics["resumed_from"], self.metrics["loss"]))
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    CheckpointedTrain()
