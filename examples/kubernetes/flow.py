"""TrainOnKubernetes: a @torchrun step on Kubernetes (needs a configured cluster; tests only check it).

train.py is a copy of examples/ddp/train.py; it travels in Metaflow's code package.
"""

from metaflow import FlowSpec, current, environment, kubernetes, step, torchrun


class TrainOnKubernetes(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=2)          # 2 pods

    @environment(vars={"NCCL_SOCKET_IFNAME": "eth0"})  # only if pods have several interfaces
    @kubernetes(gpu=8, cpu=32, memory=240000, shared_memory=16384, port=29500)
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
    TrainOnKubernetes()
