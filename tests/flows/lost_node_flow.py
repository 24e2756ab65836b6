"""A flow shaped like a user's for a node lost mid-training: a @torchrun step whose nodes each keep an
artifact of their own and one they share, and a join that counts its inputs and merges what they share
(Metaflow's ``merge_artifacts``). @torchrun's attributes come from MFTR_TORCHRUN_ATTRS."""

import json
import os

from metaflow import FlowSpec, Parameter, current, step, torchrun


class LostNodeFlow(FlowSpec):
    nodes = Parameter("nodes", default=3)
    script_args = Parameter("script-args", default="[]", help="JSON list")

    @step
    def start(self):
        self.next(self.train, num_parallel=self.nodes)

    @torchrun(**json.loads(os.environ.get("MFTR_TORCHRUN_ATTRS", "{}")))
    @step
    def train(self):
        result = current.torch.run(entrypoint=os.path.join("scripts", "snapshot_train.py"),
                                   entrypoint_args=json.loads(self.script_args), nproc_per_node=2)
        self.dataset = "toy"  # the same on every node
        self.node = current.parallel.node_index
        self.role = current.torch.role
        self.exit_code = result.exit_code
        self.next(self.join)

    @step
    def join(self, inputs):
        self.count = len(list(inputs))  # Metaflow's Inputs has no len()
        self.roles = {i.node: i.role for i in inputs}
        self.merge_artifacts(inputs, exclude=["node", "role", "exit_code"])
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    LostNodeFlow()
