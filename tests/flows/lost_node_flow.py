"""A flow shaped like a user's for a node lost mid-training: a @torchrun step whose nodes each keep an
artifact of their own and one they share, and a join that counts its inputs and merges what they share
(Metaflow's ``merge_artifacts``). @torchrun's attributes come from MFTR_TORCHRUN_ATTRS. With
MFTR_STORE_GATE="<node>:<path>", that node's task stores its artifacts only once the file exists."""

import json
import os
import time

from metaflow import FlowSpec, Parameter, current, step, torchrun


class StoredOnceOpen:
    """An artifact whose pickling (Metaflow storing the task's artifacts) waits for a file to exist."""

    def __init__(self, gate):
        self.gate = gate

    def __reduce__(self):
        while not os.path.exists(self.gate):
            time.sleep(0.05)
        return (str, ("stored",))


class LostNodeFlow(FlowSpec):
    nodes = Parameter("nodes", default=3)
    script_args = Parameter("script-args", default="[]", help="JSON list")

    @step
    def start(self):
        self.next(self.train, num_parallel=self.nodes)

    @torchrun(**json.loads(os.environ.get("MFTR_TORCHRUN_ATTRS", "{}")))
    @step
    def train(self):
        notices = os.environ.get("MFTR_SPOT_NOTICES")  # a folder: each node's notice file, as @kubernetes sets it
        if notices:
            current._update_env({"spot_termination_notice": os.path.join(
                notices, "node-%d" % current.parallel.node_index)})
        result = current.torch.run(entrypoint=os.path.join("scripts", "snapshot_train.py"),
                                   entrypoint_args=json.loads(self.script_args), nproc_per_node=2)
        self.dataset = "toy"  # the same on every node
        self.node = current.parallel.node_index
        self.role = current.torch.role
        self.exit_code = result.exit_code
        node, _, gate = os.environ.get("MFTR_STORE_GATE", "").partition(":")
        if node == str(self.node):
            self.stored_late = StoredOnceOpen(gate)
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
