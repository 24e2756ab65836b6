"""TrainOnBatch: a @torchrun step on AWS Batch (needs a configured cluster; tests only check it).

train.py is a copy of examples/ddp/train.py; it travels in Metaflow's code package.
"""

from metaflow import FlowSpec, batch, current, environment, step, torchrun

class TrainOnBatch(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=4)          # 4 nodes

    @environment(vars={"NCCL_SOCKET_IFNAME": "eth0"})  # only if nodes have several interfaces
    @batch(gpu=8, cpu=96, memory=700000, shared_memory=16384, efa=4, queue="mnp-on-demand")
    @torchrun                                           # nproc_per_node = 8, from gpu=8
    @step
    def train(self):
        current.torch.run(entrypoint="train.py", entrypoint_args={"epochs": 3})
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass

if __name__ == "__main__":
    TrainOnBatch()
