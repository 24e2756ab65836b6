"""metaflow-torchrun 0.2's TorchrunSingleNodeMultiGPU in an ordinary step (no
@parallel, no @torchrun). $MFTR_SINGLE: ok | fail | spin | derived (nproc from
@resources(gpu=2)) | positional (0.2's order: torchrun_args first) | typo (entry_point=: refused, naming entrypoint=)."""

import json
import os

from metaflow import FlowSpec, TorchrunSingleNodeMultiGPU, current, resources, step

CASE = os.environ.get("MFTR_SINGLE", "ok")
SCRIPT = {"fail": "fail.py", "spin": "spin.py"}.get(CASE, "report.py")


class SingleNodeFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @resources(gpu=2 if CASE == "derived" else None)
    @step
    def train(self):
        launcher = TorchrunSingleNodeMultiGPU()
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", SCRIPT)
        if CASE == "positional":
            result = launcher.run({"max_restarts": 0}, script, {"tag": "p"}, 2)
        elif CASE == "typo":
            result = launcher.run(entry_point=script)
        elif CASE == "derived":
            result = launcher.run(entrypoint=script)
        else:
            result = launcher.run(
                entrypoint=script,
                entrypoint_args={"rank": 1} if CASE == "fail" else None,
                nproc_per_node=2,
            )
        self.result = json.loads(result.to_json())
        self.pathspec_seen = current.pathspec
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    SingleNodeFlow()
