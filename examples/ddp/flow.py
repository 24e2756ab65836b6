import json
import os
import tempfile

from metaflow import FlowSpec, Parameter, current, step, torchrun


class DDPTrain(FlowSpec):
    """Data-parallel training of a small MLP on 2 nodes x 2 processes."""

    epochs = Parameter("epochs", default=30, help="training epochs")

    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @torchrun(nproc_per_node=2)
    @step
    def train(self):
        metrics = os.path.join(tempfile.mkdtemp(), "metrics.json")
        current.torch.run(
            entrypoint="train.py",
            entrypoint_args={"epochs": self.epochs, "metrics-out": metrics},
        )
        with open(metrics) as f:
            self.metrics = json.load(f)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.metrics = inputs[0].metrics
        print("loss %.4f -> %.4f on %d processes" % (
            self.metrics["initial_loss"], self.metrics["final_loss"],
            self.metrics["world_size"]))
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    DDPTrain()
