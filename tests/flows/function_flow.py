"""current.torch.run with Python functions: return values and exceptions.

--mode names the call; a comma-separated list ("sum,module") makes those calls
in turn in one step (one flow for several tests), each call's returns kept by
its mode (``returns_by_mode``; the join's ``rank0_by_mode``, ``all_returns_by_mode``)."""


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
        self.node_index = current.parallel.node_index
        self.returns_by_mode = {}
        for mode in self.mode.split(","):  # "sum,module": those calls in turn, in one flow
            if mode == "sum":
                result = current.torch.run(entrypoint=allreduce_sum, entrypoint_args={"scale": 10})
            elif mode == "module":
                result = current.torch.run(entrypoint=describe, entrypoint_args=["tagged"])
            elif mode == "hold":
                result = current.torch.run(entrypoint=hold)
            elif mode == "hang":
                result = current.torch.run(entrypoint=quiet_wait, entrypoint_args={"seconds": 3600})
            else:
                result = current.torch.run(entrypoint=raise_on, entrypoint_args={"rank": 1})
            self.returns_by_mode[mode] = result.returns
        self.returns = result.returns
        self.rank0 = result.returns[0] if self.node_index == 0 else None
        self.next(self.join)

    @step
    def join(self, inputs):
        self.rank0 = [i.rank0 for i in inputs if i.node_index == 0][0]
        self.all_returns = {}
        self.rank0_by_mode, self.all_returns_by_mode = {}, {}
        for i in inputs:
            self.all_returns.update(i.returns)
            for mode, returns in i.returns_by_mode.items():
                self.all_returns_by_mode.setdefault(mode, {}).update(returns)
                if i.node_index == 0:
                    self.rank0_by_mode[mode] = returns[0]
        self.next(self.end)

    @step
    def end(self):
        print("rank 0 returned", self.rank0)


if __name__ == "__main__":
    FunctionFlow()
