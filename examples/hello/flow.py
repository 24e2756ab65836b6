from metaflow import FlowSpec, current, step, torchrun


class HelloTorchrun(FlowSpec):
    """2 nodes x 2 processes: every rank says hello and joins one all-reduce."""

    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @torchrun(nproc_per_node=2)
    @step
    def train(self):
        current.torch.run(entrypoint="hello.py")
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        print("all nodes finished")


if __name__ == "__main__":
    HelloTorchrun()
