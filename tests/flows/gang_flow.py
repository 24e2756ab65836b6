"""One flow for the integration tests: which script runs, with which arguments,
on how many nodes and processes, all come from parameters.

--calls (a JSON list) makes several calls in the one step instead, each
{"name", "script", "args", "nproc", "torchrun_args"} (issue 50: a flow costs
about 15 CPU-s, a call in a running gang a fraction of that). Each call's ranks
write their reports under $MFTR_TEST_OUT/<name>/; each node keeps every call's
result (``TorchrunResult.to_dict()`` as JSON) in ``results``, by name, and the
join keeps them by node (tests/integration/calls.py reads them)."""

import json
import os
import sys
import time

from metaflow import FlowSpec, Parameter, current, step, torchrun

if " card create " in " ".join(sys.argv) and os.environ.get("MFTR_TEST_OUT"):
    # Metaflow's card subprocess imports this file: the tests count them.
    with open(os.path.join(os.environ["MFTR_TEST_OUT"], "card-create.log"), "a") as f:
        f.write(" ".join(sys.argv) + "\n")


def call_in_turn(call):
    """One call of --calls, its ranks' reports in a folder of its own."""
    out = os.environ.get("MFTR_TEST_OUT")
    if out:
        os.environ["MFTR_TEST_OUT"] = os.path.join(out, call["name"])
    try:
        return current.torch.run(
            entrypoint=os.path.join("scripts", call["script"]),
            entrypoint_args=call.get("args"),
            nproc_per_node=call.get("nproc"),
            torchrun_args=call.get("torchrun_args"),
        )
    finally:
        if out:
            os.environ["MFTR_TEST_OUT"] = out


class GangFlow(FlowSpec):
    script = Parameter("script", default="report.py")
    script_args = Parameter("script-args", default="null", help="JSON list or dict")
    nodes = Parameter("nodes", default=2)
    nproc = Parameter("nproc", default=2, help="0: do not pass nproc_per_node")
    torchrun_args = Parameter("torchrun-args", default="null", help="JSON")
    calls = Parameter("calls", default="null", help="JSON list of calls, made in order in one step")

    @step
    def start(self):
        self.next(self.train, num_parallel=self.nodes)

    @torchrun(**json.loads(os.environ.get("MFTR_TORCHRUN_ATTRS", "{}")))
    @step
    def train(self):
        if str(current.parallel.node_index) == os.environ.get("MFTR_SKIP_NODE"):
            # This node "never starts" its torchrun, or starts it once the test
            # creates the file MFTR_SKIP_UNTIL names.
            until = os.environ.get("MFTR_SKIP_UNTIL")
            deadline = time.monotonic() + 3600
            while time.monotonic() < deadline and not (until and os.path.exists(until)):
                time.sleep(0.05)
        calls = json.loads(self.calls)
        self.results = None
        role_before = current.torch.role  # @torchrun(spares): a spare's step knows it is one before any call
        if calls is None:
            result = current.torch.run(
                entrypoint=os.path.join("scripts", self.script),
                entrypoint_args=json.loads(self.script_args),
                nproc_per_node=self.nproc or None,
                torchrun_args=json.loads(self.torchrun_args),
            )
        else:
            self.results = {}
            for call in calls:
                result = call_in_turn(call)
                self.results[call["name"]] = json.dumps(result.to_dict(), default=str)
        self.node_index = current.parallel.node_index
        self.torch_roles = (role_before, current.torch.role)
        self.exit_code = result.exit_code
        self.result_line = str(result)  # print(result): what a user reads of the call on this node
        self.next(self.join)

    @step
    def join(self, inputs):
        self.node_indices = sorted(i.node_index for i in inputs)
        self.results = {i.node_index: i.results for i in inputs}
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    GangFlow()
