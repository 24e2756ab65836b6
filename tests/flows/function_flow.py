"""current.torch.run with Python functions: return values and exceptions."""


import json
import os

from metaflow import FlowSpec, Parameter, current, step, torchrun

from fnlib import describe, hold, quiet_wait, raise_on


def allreduce_sum(scale):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() * scale)])
    dist.all_reduce(t)
    rank = dist.get_rank()
    dist.destroy_process_group()
    return {"rank": rank, "sum": int(t.item())}


class FunctionFlow(FlowSpec):
    mode = Parameter("mode", default="sum")

    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @torchrun(nproc_per_node=2, **json.loads(os.environ.get("MFTR_TORCHRUN_ATTRS", "{}")))
    @step
    def train(self):
        if self.mode == "sum":
            result = current.torch.run(entrypoint=allreduce_sum, entrypoint_args={"scale": 10})
        elif self.mode == "module":
            result = current.torch.run(entrypoint=describe, entrypoint_args=["tagged"])
        elif self.mode == "hold":
            result = current.torch.run(entrypoint=hold)
        elif self.mode == "hang":
            result = current.torch.run(entrypoint=quiet_wait, entrypoint_args={"seconds": 3600})
        else:
            result = current.torch.run(entrypoint=raise_on, entrypoint_args={"rank": 1})
        self.returns = result.returns
        self.node_index = current.parallel.node_index
        self.rank0 = result.returns[0] if self.node_index == 0 else None
        self.next(self.join)

    @step
    def join(self, inputs):
        self.rank0 = [i.rank0 for i in inputs if i.node_index == 0][0]
        self.all_returns = {}
        for i in inputs:
            self.all_returns.update(i.returns)
        self.next(self.end)

    @step
    def end(self):
        print("rank 0 returned", self.rank0)


if __name__ == "__main__":
    FunctionFlow()
