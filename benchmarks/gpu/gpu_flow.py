"""The GPU check's flow: one train step, run with @torchrun or by hand.

Everything comes from the environment so the check can run every case with one
file: GPUCHECK_MODE (torchrun | hand), GPUCHECK_GPUS (@resources(gpu=N), 0 for
none), GPUCHECK_NODES (num_parallel), GPUCHECK_NPROC (explicit nproc_per_node,
0 to derive it), GPUCHECK_KIND (allreduce | assert | train | skip | kill),
GPUCHECK_PREFLIGHT (@torchrun(preflight=...): versions | full | off),
GPUCHECK_HANG_TIMEOUT (@torchrun(hang_timeout=...), seconds), GPUCHECK_OUT.
"""

import os
import subprocess
import sys
import time

from metaflow import FlowSpec, current, resources, step, torchrun

GPUS = int(os.environ.get("GPUCHECK_GPUS", "1"))
NPROC = int(os.environ.get("GPUCHECK_NPROC", "0")) or None
HANG = {"hang_timeout": float(os.environ["GPUCHECK_HANG_TIMEOUT"])} if os.environ.get("GPUCHECK_HANG_TIMEOUT") else {}
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_job.py")


def task_started_at() -> float:
    """When this task's process started (epoch seconds): the clock of "time to
    the first rank line" starts here, before any decorator hook runs."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


class GpuCheckFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=int(os.environ.get("GPUCHECK_NODES", "1")))

    @resources(gpu=GPUS)
    @torchrun(nproc_per_node=NPROC, preflight=os.environ.get("GPUCHECK_PREFLIGHT", "versions"), **HANG)
    @step
    def train(self):
        out = os.environ["GPUCHECK_OUT"]
        if current.parallel.node_index == 0:
            with open(os.path.join(out, "task-start"), "w") as f:
                f.write(repr(task_started_at()))
        args = [os.environ.get("GPUCHECK_KIND", "allreduce"), out]
        if os.environ.get("GPUCHECK_MODE", "torchrun") == "hand":
            nproc = NPROC or GPUS or 1
            subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", str(nproc), JOB] + args,
                check=True,
            )
        else:
            current.torch.run(entrypoint=JOB, entrypoint_args=args)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    started = time.time()
    GpuCheckFlow()
