"""A plain HF Trainer script with nothing of @torchrun's in its training: the snapshots are the
injected callback's. A one-layer BERT built from a config (no download), dropout on, so the
RNG's restore shows in the weights. What the test adds, beside the training:

--kill-at S  rank 1 SIGKILLs itself at step S's end, once: $MFTR_TEST_OUT/killed marks it done.
Each start appends its first step to $MFTR_TEST_OUT/starts-rank-<R>.jsonl (with when the rank
reached this script and finished that step, and whether transformers was already imported as the
script began: a rank forked from a warm process that had learned it), and what the rank holds then:
its resident memory (and before train()), the bytes of the CPU tensors alive in it, its model's, and the
resume directories left in its temporary directory; rank 0 writes the final weights' sha256 to
$MFTR_TEST_OUT/weights.sha256. --vocab V: a larger embedding (a larger state, for a measurement).
"""

import argparse
import gc
import hashlib
import json
import os
import signal
import sys
import tempfile
import time

ENTERED, WARM = time.time(), "transformers" in sys.modules  # before the script's own imports of torch and HF

import torch  # noqa: E402
from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainerCallback,  # noqa: E402
                          TrainingArguments)

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--kill-at", type=int, default=0)
parser.add_argument("--pause", type=float, default=0.005)
parser.add_argument("--vocab", type=int, default=64)
opts = parser.parse_args()
OUT = os.environ["MFTR_TEST_OUT"]
RANK = int(os.environ.get("RANK", "0"))


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 512

    def __getitem__(self, i):
        time.sleep(opts.pause)  # read from somewhere, as a real dataset is
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 64, (8,), generator=g), "labels": torch.tensor(i % 2)}


class Witness(TrainerCallback):
    """The test's eyes and its failure: not a part of the training."""

    def __init__(self):
        self.first = True

    def on_step_end(self, args, state, control, **kwargs):
        if self.first:
            self.first = False
            at = time.time()  # the step done (benchmarks/restart_scale.py reads it), before the memory scan
            held = {"rss": rss(), "rss_before": RSS_BEFORE[0], "tensor_bytes": tensor_bytes(),
                    "model_bytes": sum(t.nbytes for t in kwargs["model"].state_dict().values()),
                    "resume_dirs": [n for n in os.listdir(tempfile.gettempdir()) if n.startswith("snapshot-hf-")]}
            with open(os.path.join(OUT, "starts-rank-%d.jsonl" % RANK), "a") as f:
                f.write(json.dumps(dict(held, first_step=state.global_step, pid=os.getpid(), script_at=ENTERED,
                                        at=at, warm=WARM)) + "\n")
        marker = os.path.join(OUT, "killed")
        if RANK == 1 and state.global_step == opts.kill_at and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


RSS_BEFORE = [0]


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def tensor_bytes():
    """The bytes of every CPU tensor's storage alive in this process, each storage once."""
    storages = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def digest(model):
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def train():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=opts.vocab, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, num_labels=2)
    model = BertForSequenceClassification(config)
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=opts.steps, per_device_train_batch_size=4,
                             logging_steps=1, learning_rate=1e-3, report_to=[], save_strategy="no", use_cpu=True,
                             seed=7, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Witness()])
    RSS_BEFORE[0] = rss()
    trainer.train()
    if RANK == 0:
        with open(os.path.join(OUT, "weights.sha256"), "w") as f:
            f.write(digest(trainer.model))


torch.set_num_threads(1)  # the same sums however the ranks are placed (torchrun sets 1 thread only for 2+ a node)
train()
# The trainer, and the DDP model that holds the process group, gone before the group (as train_tiny.py):
# left at module level under torch's own torchrun, gloo's threads lived to the interpreter's finalization,
# and a CI run's rank 1 was ended there ('terminate called without an active exception', SIGABRT).
if torch.distributed.is_initialized():
    torch.distributed.barrier()
    gc.collect()
    torch.distributed.destroy_process_group()
