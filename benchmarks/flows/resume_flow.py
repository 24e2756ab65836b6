"""The job of benchmarks/resume.py: a small DDP model with @checkpoint, 2 nodes
x 2 processes, gloo, that fails once and starts again.

$BENCH_RESUME (JSON) picks the path and the failure:
``path``: "retry" (@retry reruns the gang) or "instep" (the ranks are started
again inside the same tasks); ``fail``: "node-kill" (node 1's task SIGKILLed),
"rank-raise" (a rank of node 1 raises) or "rank-kill" (a rank of node 1
SIGKILLs itself); ``after``: the epoch it fails after; ``epochs``.
"""

import json
import os
import sys

from metaflow import FlowSpec, checkpoint, current, retry, step, torchrun

SCRIPTS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "scripts"))
CONF = json.loads(os.environ.get("BENCH_RESUME") or "{}")
# The in-step path: torchrun's own restart until @torchrun(restarts=N) lands;
# then this one line becomes {"restarts": 1}.
INSTEP = {"restarts": 1}  # the gang restarts the ranks in the same tasks
TORCHRUN = INSTEP if CONF.get("path") == "instep" else {}


class BenchResumeFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @retry(times=1 if CONF.get("path", "retry") == "retry" else 0, minutes_between_retries=0)
    @checkpoint
    @torchrun(**TORCHRUN)
    @step
    def train(self):
        out = os.environ["BENCH_OUT"]
        with open(os.path.join(out, "task-pid-%d" % current.parallel.node_index), "w") as f:
            f.write(str(os.getpid()))
        args = {"attempt": current.retry_count, "fail": CONF.get("fail", "node-kill"),
                "after": CONF.get("after", 1), "epochs": CONF.get("epochs", 2)}
        if current.checkpoint.is_loaded:
            args["resume-dir"] = current.checkpoint.directory
        current.torch.run(entrypoint=os.path.join(SCRIPTS, "resume_train.py"), entrypoint_args=args,
                          nproc_per_node=2)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    sys.exit(BenchResumeFlow())
