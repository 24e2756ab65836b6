"""metaflow-torchrun 0.2's TorchrunSingleNodeMultiGPU in an ordinary step (no
@parallel, no @torchrun). $MFTR_SINGLE: ok | fail | spin | derived (nproc from
@resources(gpu=2)) | positional (0.2's order: torchrun_args first) | typo (entry_point=: refused, naming entrypoint=).
Several cases, comma-separated ("ok,positional"): those calls in turn in one step, each call's
ranks reporting under $MFTR_TEST_OUT/<case>/ and its result kept in ``results`` by case."""

import json
import os

from metaflow import FlowSpec, TorchrunSingleNodeMultiGPU, current, resources, step

CASES = os.environ.get("MFTR_SINGLE", "ok").split(",")


class SingleNodeFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @resources(gpu=2 if "derived" in CASES else None)
    @step
    def train(self):
        self.results = {}
        out = os.environ.get("MFTR_TEST_OUT")
        for case in CASES:
            if len(CASES) > 1 and out:
                os.environ["MFTR_TEST_OUT"] = os.path.join(out, case)
            launcher = TorchrunSingleNodeMultiGPU()
            script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts",
                                  {"fail": "fail.py", "spin": "spin.py"}.get(case, "report.py"))
            if case == "positional":
                result = launcher.run({"max_restarts": 0}, script, {"tag": "p"}, 2)
            elif case == "typo":
                result = launcher.run(entry_point=script)
            elif case == "derived":
                result = launcher.run(entrypoint=script)
            else:
                result = launcher.run(
                    entrypoint=script,
                    entrypoint_args={"rank": 1} if case == "fail" else None,
                    nproc_per_node=2,
                )
            self.result = json.loads(result.to_json())
            self.results[case] = self.result
        self.pathspec_seen = current.pathspec
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    SingleNodeFlow()
