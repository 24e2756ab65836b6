"""A DDP loop on 2 nodes x 2 processes where rank 1 raises after loss.backward()
(the first hour of a new user, issue 36): a function or a script entrypoint."""

from metaflow import FlowSpec, Parameter, TorchrunException, current, step, torchrun


def nan_seen(rank, *args, **kwargs):
    raise ValueError("rank %d saw a NaN (step must be an int from 0 to 2**53)" % rank)


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
            nan_seen(bad_rank, *[i], lr=lambda s: 0.9 ** s)  # a traceback with stars: printed as written
        opt.step()
    dist.destroy_process_group()
    return dist.get_rank()


class DdpFailFlow(FlowSpec):
    mode = Parameter("mode", default="function")
    caught = Parameter("caught", default="", help="catch around the call: true (ValueError) or all")
    bad_rank = Parameter("bad-rank", default=1, help="the rank that raises (a function entrypoint)")

    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @torchrun(nproc_per_node=2)
    @step
    def train(self):
        if self.mode == "function":
            call = dict(entrypoint=train, entrypoint_args={"steps": 5, "bad_rank": int(self.bad_rank)})
        else:
            call = dict(entrypoint="scripts/ddp_fail.py", entrypoint_args={"steps": 5, "api-token": "s3cr3t"})
        if self.caught:
            # "true": `except ValueError` (the node whose rank raised catches it);
            # "all": `except TorchrunException`, which every node's is (the others' is GangAborted).
            caught = TorchrunException if self.caught == "all" else ValueError
            try:
                current.torch.run(**call)
            except caught as e:
                print("node %d caught %s: %s" % (current.parallel.node_index, type(e).__name__, str(e)[:80]))
        else:
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
