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
import socket
import sys
import time

from metaflow import FlowSpec, Parameter, current, step, torchrun

if " card create " in " ".join(sys.argv) and os.environ.get("MFTR_TEST_OUT"):
    # Metaflow's card subprocess imports this file: the tests count them.
    with open(os.path.join(os.environ["MFTR_TEST_OUT"], "card-create.log"), "a") as f:
        f.write(" ".join(sys.argv) + "\n")


def writes_of_a_print():
    """How many write(2)s one print() of the step makes: fd 1, a moment, on a SOCK_SEQPACKET socket, which
    keeps each write a message of its own (a write of another thread meanwhile is not counted)."""
    ours, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(its.fileno(), 1)
    try:
        print("one line")
        sys.stdout.flush()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        its.close()
    messages = []
    while True:
        message = ours.recv(1 << 16)
        if not message:
            break
        messages.append(message)
    ours.close()
    return sum(1 for m in messages if m in (b"one line", b"\n", b"one line\n"))


def print_with_the_other_nodes(folder, lines):
    """``lines`` print()s of this node's step, every node at once: each says it is here in ``folder`` (a
    local run's nodes share the host) and waits for the others first (at most 60 s). Before them, how
    many writes one print() makes, in ``print-writes-<node>.json``."""
    node, nodes = current.parallel.node_index, current.parallel.num_nodes
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "print-writes-%d.json" % node), "w") as f:
        json.dump(writes_of_a_print(), f)
    open(os.path.join(folder, "step-prints-%d" % node), "w").close()
    deadline = time.monotonic() + 60  # a spin, not a sleep: a node woken late printed alone
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(folder, "step-prints-%d" % n)) for n in range(nodes)):
        pass
    for i in range(lines):
        print("node %d prints line %d of its step" % (node, i))


def call_in_turn(call):
    """One call of --calls, its ranks' reports in a folder of its own; with "step_prints", the step's own
    print()s on every node at once before it."""
    out = os.environ.get("MFTR_TEST_OUT")
    if out:
        os.environ["MFTR_TEST_OUT"] = os.path.join(out, call["name"])
        if call.get("step_prints"):
            print_with_the_other_nodes(os.environ["MFTR_TEST_OUT"], call["step_prints"])
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
