"""Many refused current.torch.run calls, one flow (issue 50): each call in turn,
caught in the step, its refusal (type and message) kept per node in
``$MFTR_TEST_OUT/refusals/<name>-<node>.json``.

A refusal happens at the call, before any agent starts, so one step can make
them all; tests of the console screen of a step that fails on a refusal keep
their own flows (call_flow.py). MFTR_REFUSALS: a JSON object, name -> the
call's keywords (entrypoint relative to this file's scripts/ unless null;
"" is scripts/ itself; "*": positional arguments, passed as they are).
MFTR_TORCHRUN: the step's @torchrun attributes (a JSON object, default none).
"""

import contextlib
import json
import os

from metaflow import FlowSpec, current, step, torchrun

HERE = os.path.dirname(os.path.abspath(__file__))


class RefusalsFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @torchrun(**json.loads(os.environ.get("MFTR_TORCHRUN", "{}")))
    @step
    def train(self):
        out = os.path.join(os.environ["MFTR_TEST_OUT"], "refusals")
        os.makedirs(out, exist_ok=True)
        # The entrypoint is looked up from the working directory; back after, for Metaflow's card
        # store, which finds its folder from there (it wrote the card into tests/flows).
        with contextlib.chdir(HERE):
            for name, kwargs in json.loads(os.environ["MFTR_REFUSALS"]).items():
                if kwargs.get("entrypoint") is not None:
                    kwargs["entrypoint"] = os.path.join("scripts", kwargs["entrypoint"])
                args = kwargs.pop("*", [])  # positional arguments, as written (0.2's order)
                try:
                    current.torch.run(*args, **kwargs)
                    said = {"type": None, "message": "not refused"}
                except Exception as e:  # what the user's own except would see
                    said = {"type": type(e).__name__, "message": str(e)}
                with open(os.path.join(out, "%s-%d.json" % (name, current.parallel.node_index)), "w") as f:
                    json.dump(said, f)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    RefusalsFlow()
