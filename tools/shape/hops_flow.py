"""The flow ``tools/shape/call_hops.py`` traces: one script call on 2 local
nodes; the control traces its own call path up to the agent's start."""

import json
import os
import subprocess
import sys

from metaflow import FlowSpec, current, step, torchrun

PACKAGE = os.sep + os.path.join("metaflow_extensions", "torchrun", "plugins", "torchrun") + os.sep


class HopsFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @torchrun(nproc_per_node=1, preflight=False, card=False)
    @step
    def train(self):
        trace = []
        is_control = current.parallel.node_index == 0

        def profile(frame, event, arg):
            # Every Python call whose callee is in the package, with its caller's
            # module; tracing stops at the Popen that starts torchrun's agent.
            if event != "call":
                return
            code = frame.f_code
            if code is subprocess.Popen.__init__.__code__:
                sys.setprofile(None)
                return
            if PACKAGE in code.co_filename:
                back = frame.f_back.f_code if frame.f_back else None
                trace.append([back.co_filename if back else "", back.co_name if back else "",
                              code.co_filename, code.co_name])

        if is_control:
            sys.setprofile(profile)
        current.torch.run(entrypoint="noop.py")
        sys.setprofile(None)
        if is_control:
            with open(os.environ["HOPS_OUT"], "w") as f:
                json.dump(trace, f)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    HopsFlow()
