"""A DDP loop on 2 nodes x 2 processes where rank 1 raises after loss.backward()
(the first hour of a new user, issue 36): a function or a script entrypoint."""

from metaflow import FlowSpec, Parameter, current, step, torchrun


def train(steps=5, bad_rank=1):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(steps):
        loss = model(torch.randn(8, 4)).sum()
        loss.backward()
        if dist.get_rank() == bad_rank and i == 2:
            raise ValueError("rank %d saw a NaN" % bad_rank)
        opt.step()
    dist.destroy_process_group()
    return dist.get_rank()


class DdpFailFlow(FlowSpec):
    mode = Parameter("mode", default="function")
    caught = Parameter("caught", default=False, help="catch ValueError around the call")

    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @torchrun(nproc_per_node=2)
    @step
    def train(self):
        if self.mode == "function":
            call = dict(entrypoint=train, entrypoint_args={"steps": 5})
        else:
            call = dict(entrypoint="scripts/ddp_fail.py", entrypoint_args={"steps": 5, "api-token": "s3cr3t"})
        if self.caught:
            try:
                current.torch.run(**call)
            except ValueError as e:
                print("caught ValueError: %s" % e)
                raise SystemExit("handled")
        current.torch.run(**call)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    DdpFailFlow()
