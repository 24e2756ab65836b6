"""Distribute a Python function instead of a script: every rank runs it, and
rank 0's return value comes back to the step as a plain Python object."""

from metaflow import FlowSpec, current, step, torchrun


def estimate_pi(samples_per_rank: int) -> float:
    """Each rank throws darts; an all-reduce adds up the hits of all ranks."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    g = torch.Generator().manual_seed(dist.get_rank())
    points = torch.rand(samples_per_rank, 2, generator=g)
    hits = torch.tensor([float((points.pow(2).sum(dim=1) <= 1).sum())])
    dist.all_reduce(hits)
    total = samples_per_rank * dist.get_world_size()
    dist.destroy_process_group()
    return 4 * hits.item() / total


class PiFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.estimate, num_parallel=2)

    @torchrun(nproc_per_node=2)
    @step
    def estimate(self):
        result = current.torch.run(
            entrypoint=estimate_pi, entrypoint_args={"samples_per_rank": 250_000}
        )
        # On the control node, rank 0's value is always there.
        self.pi = result.returns.get(0)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.pi = next(i.pi for i in inputs if i.pi is not None)
        self.next(self.end)

    @step
    def end(self):
        print("pi is about %.4f" % self.pi)


if __name__ == "__main__":
    PiFlow()
