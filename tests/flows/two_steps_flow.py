"""Two @torchrun steps, each joined with Metaflow's own idiom,
``self.merge_artifacts(inputs)`` (issue 52): a 0.2 client's shape, preprocessing
then training. What @torchrun keeps on a task must never make that join fail.
$MFTR_TWO: "ok", or "retry" (each step's first attempt fails: rank 1, on node 1,
raises; @retry runs it again). 1 process per node, 2 nodes."""

import os

from metaflow import FlowSpec, current, retry, step, torchrun

CASE = os.environ.get("MFTR_TWO", "ok")


def work(tag):
    """The attempt's call: it fails on node 1 in the first attempt of the "retry" case."""
    if CASE == "retry" and current.retry_count == 0:
        current.torch.run(entrypoint=os.path.join("scripts", "fail.py"), entrypoint_args={"rank": 1})
    current.torch.run(entrypoint=os.path.join("scripts", "tagged.py"), entrypoint_args=[tag])


class TwoStepsFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.preprocess, num_parallel=2)

    @retry(times=1, minutes_between_retries=0)
    @torchrun
    @step
    def preprocess(self):
        work("preprocess")
        self.next(self.end_preprocess)

    @step
    def end_preprocess(self, inputs):
        self.merge_artifacts(inputs)
        self.next(self.split)

    @step
    def split(self):
        self.next(self.train, num_parallel=2)

    @retry(times=1, minutes_between_retries=0)
    @torchrun
    @step
    def train(self):
        work("train")
        self.next(self.end_train)

    @step
    def end_train(self, inputs):
        self.merge_artifacts(inputs)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    TwoStepsFlow()
