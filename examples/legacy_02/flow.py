"""A flow written for metaflow-torchrun 0.2, left as its author wrote it: only the
install line changed (see "Coming from metaflow-torchrun 0.2" in the README).

It uses 0.2's single-node launcher in an ordinary step, then a two-node
@torchrun step with 0.2's attribute names, 0.2's list form of torchrun_args and
None for store_true flags. Run it with `python flow.py run`; each 0.2 spelling
prints one deprecation line saying what to write today.
"""

from metaflow import FlowSpec, Parameter, TorchrunSingleNodeMultiGPU, current, step, torchrun

N_NODES = 2
N_PROCS = 2


class TorchrunLegacyFlow(FlowSpec):
    message = Parameter("message", default="hello from 0.2")

    @step
    def start(self):
        self.next(self.single_node)

    @step
    def single_node(self):
        executor = TorchrunSingleNodeMultiGPU()
        executor.run(
            entrypoint="script.py",
            entrypoint_args={"message": self.message, "verbose": None},
            nproc_per_node=N_PROCS,
        )
        self.next(self.prepare)

    @step
    def prepare(self):
        self.next(self.multinode, num_parallel=N_NODES)

    # A pinned port below Linux's ephemeral range (32768-60999): no outgoing
    # connection on the host can be holding it when the rendezvous binds it.
    @torchrun(all_nodes_started_timeout=300, master_port=29501)
    @step
    def multinode(self):
        current.torch.run(
            entrypoint="script.py",
            entrypoint_args={"message": self.message, "verbose": None},
            nproc_per_node=N_PROCS,
            torchrun_args=["max_restarts", 0],
        )
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        print("done")


if __name__ == "__main__":
    TorchrunLegacyFlow()
