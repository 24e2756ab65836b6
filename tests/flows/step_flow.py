"""Failures anywhere in a @torchrun step, not only inside current.torch.run.

The plan for each node comes from the environment, so one flow covers every
case: how many calls each node makes, where a node raises, is killed or sleeps.
MFTR_STEP: a JSON object {"calls": 2, "node": {"1": {"raise": "before"}}}, where a
node's entry may hold "raise" (before | between | after), "kill" (before),
"sleep" (seconds, before anything else), "calls" (its own number of calls), "script" (its own
script for the second call), "attempt" (only on this retry attempt).
MFTR_NEVER_START: the index of a node whose task never reaches its step.
MFTR_EXIT_AT_START: the index of a node whose task exits (code 3) as the flow file
is read, before it can join the gang, saying why on stderr.
MFTR_NPROC: processes per node (default 1: these are failures of nodes and steps).
"""

import json
import os
import signal
import time

if os.environ.get("MFTR_NEVER_START") not in (None, "") and os.environ.get(
    "MF_PARALLEL_NODE_INDEX"
) == os.environ["MFTR_NEVER_START"]:
    time.sleep(3600)  # this node's task never gets as far as its step

if os.environ.get("MFTR_EXIT_AT_START") not in (None, "") and os.environ.get(
    "MF_PARALLEL_NODE_INDEX"
) == os.environ["MFTR_EXIT_AT_START"]:
    import sys

    sys.stderr.write("step_flow: node %s cannot start here (MFTR_EXIT_AT_START)\n" % os.environ["MFTR_EXIT_AT_START"])
    sys.exit(3)

from metaflow import FlowSpec, current, retry, step, torchrun  # noqa: E402


def _mark_failure():
    out = os.environ.get("MFTR_TEST_OUT")
    if out:
        with open(os.path.join(out, "failed-at"), "w") as f:
            f.write(repr(time.time()))


def _act(mine, where):
    if where == "before" and mine.get("sleep"):
        time.sleep(float(mine["sleep"]))
    if mine.get("raise") == where or mine.get("kill") == where:
        _mark_failure()
    if mine.get("raise") == where:
        raise RuntimeError("node %d gave up %s" % (current.parallel.node_index, where))
    if mine.get("kill") == where:
        os.kill(os.getpid(), signal.SIGKILL)


class StepFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @retry(times=int(os.environ.get("MFTR_RETRIES", "0")), minutes_between_retries=0)
    @torchrun(**json.loads(os.environ.get("MFTR_TORCHRUN_ATTRS", "{}")))
    @step
    def train(self):
        plan = json.loads(os.environ.get("MFTR_STEP", "{}"))
        node = current.parallel.node_index
        mine = dict(plan.get("node", {}).get(str(node), {}))
        if "attempt" in mine and mine["attempt"] != current.retry_count:
            mine = {}
        _act(mine, "before")
        calls = int(mine.get("calls", plan.get("calls", 1)))
        self.sums = []
        for k in range(calls):
            if k > 0:
                _act(mine, "between")
            script = mine.get("script") if k == 1 and mine.get("script") else "tagged.py"
            result = current.torch.run(
                entrypoint=os.path.join("scripts", script),
                entrypoint_args=["a%d-c%d" % (current.retry_count, k)],
                nproc_per_node=int(os.environ.get("MFTR_NPROC", "1")),
            )
            self.sums.append(result.exit_code)
        _act(mine, "after")
        self.next(self.join)

    @step
    def join(self, inputs):
        self.calls = [len(i.sums) for i in inputs]
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    StepFlow()
