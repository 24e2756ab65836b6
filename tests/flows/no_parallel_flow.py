"""@torchrun on a step entered without num_parallel: must be refused at start."""

from metaflow import FlowSpec, current, step, torchrun


class NoParallelFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torchrun
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
    NoParallelFlow()
