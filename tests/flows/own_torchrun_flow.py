"""Code from the ecosystem that reads metaflow-torchrun 0.2's attributes (issue 41):
the step builds its own torchrun command from current.torch.torchrun_args, as
Outerbounds' TorchTune plugin does (c10d, --rdzv-endpoint, a fixed --rdzv-id,
--node-rank), at 2 x 2, and trains. Then an HfArgumentParser bool that defaults
to True gets entrypoint_args False (left out, and said) and 'false' (passed)."""

import json
import os
import subprocess
import sys

from metaflow import FlowSpec, current, step, torchrun

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


class OwnTorchrunFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @torchrun(nproc_per_node=2)
    @step
    def train(self):
        args = current.torch.torchrun_args
        with open(os.path.join(os.environ["MFTR_TEST_OUT"], "args-%d.json" % current.parallel.node_index), "w") as f:
            json.dump(dict(args, type_of_port=type(args["master_port"]).__name__), f)
        # The TorchTune plugin's command, with `python -m torch.distributed.run` for `tune run`.
        command = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(args["nnodes"]),
            "--nproc-per-node", str(args["nproc_per_node"]),
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", "%s:%s" % (args["master_addr"], int(args["master_port"])),
            "--rdzv-id", "1234567890",
            "--node-rank", str(args["node_rank"]),
            os.path.join(SCRIPTS, "train_tiny.py"),
        ]
        subprocess.run(command, check=True, stdin=subprocess.DEVNULL, timeout=180)
        hf = os.path.join(SCRIPTS, "hf_bool.py")
        current.torch.run(entrypoint=hf, entrypoint_args={"use_feature": False, "tag": "bool"}, nproc_per_node=1)
        current.torch.run(entrypoint=hf, entrypoint_args={"use_feature": "false", "tag": "text"}, nproc_per_node=1)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    OwnTorchrunFlow()
