"""A rank prints 200-line tensors while the control speaks (@torchrun lines
from another thread, as the gang service's progress does): issue 36, item 2."""

import threading

from metaflow import FlowSpec, current, step, torchrun
from metaflow_extensions.torchrun.plugins.torchrun.host.console import say


class TalkFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=1)

    @torchrun(nproc_per_node=1)
    @step
    def train(self):
        done = threading.Event()

        def talk():
            n = 0
            while not done.wait(0.01):
                n += 1
                say("the control speaks (%d)" % n)

        threading.Thread(target=talk, daemon=True).start()
        try:
            current.torch.run(entrypoint="scripts/tensor.py", entrypoint_args=["8"])
        finally:
            done.set()
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    TalkFlow()
