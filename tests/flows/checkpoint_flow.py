"""The checkpoint/resume pattern of Outerbounds' cifar_distributed example,
small and on CPU: @retry @checkpoint @torchrun; ranks save per-epoch
checkpoints; a retried gang resumes from the last one.

$MFTR_CKPT: JSON of the training script's options (kill-after-epoch, epochs,
save-seconds); $MFTR_CKPT_POLICY: @checkpoint's load_policy (default "fresh");
$MFTR_RETRY_ON: @torchrun(retry_on=...); $MFTR_RESTARTS: @torchrun(restarts=...); $MFTR_CKPT_BUG: "1" makes the step's
code raise a ValueError on every attempt, before its call; $MFTR_CKPT_NPROC: processes per node (2);
$MFTR_CKPT_CARD: "1" shows @checkpoint's own card, as it does by default. Off otherwise: it costs two
`card create` processes per task (about 0.5 CPU-s each, three attempts' worth in some runs), and the
tests here read our resume, not that card; one run keeps it, so both cards are made side by side."""

import json
import os

from metaflow import FlowSpec, checkpoint, current, retry, step, torchrun

RETRY_ON = os.environ.get("MFTR_RETRY_ON")
TORCHRUN = dict({"retry_on": RETRY_ON} if RETRY_ON else {},
                **({"restarts": int(os.environ["MFTR_RESTARTS"])} if os.environ.get("MFTR_RESTARTS") else {}))


class CheckpointFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @retry(times=int(os.environ.get("MFTR_RETRIES", "1")), minutes_between_retries=0)
    @checkpoint(load_policy=os.environ.get("MFTR_CKPT_POLICY", "fresh"), show_card=os.environ.get("MFTR_CKPT_CARD") == "1")
    @torchrun(**TORCHRUN)
    @step
    def train(self):
        node = current.parallel.node_index
        out = os.environ["MFTR_TEST_OUT"]
        with open(os.path.join(out, "task-pid-%d" % node), "w") as f:
            f.write(str(os.getpid()))
        info = current.checkpoint.info if current.checkpoint.is_loaded else None
        with open(os.path.join(out, "loaded-%d-%d.json" % (node, current.retry_count)), "w") as f:
            json.dump({
                "is_loaded": current.checkpoint.is_loaded,
                "key": info.key if info else None,
                "pathspec": info.pathspec if info else None,
                "identity": current.checkpoint.task_identifier,
            }, f)
        if os.environ.get("MFTR_CKPT_BUG") == "1":
            raise ValueError("a bug in the step's own code")
        args = dict(json.loads(os.environ.get("MFTR_CKPT", "{}")), attempt=current.retry_count)
        if current.checkpoint.is_loaded:
            args["resume-dir"] = current.checkpoint.directory
        current.torch.run(entrypoint="scripts/ckpt_train.py", entrypoint_args=args,
                          nproc_per_node=int(os.environ.get("MFTR_CKPT_NPROC", "2")))
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    CheckpointFlow()
