"""A plain Lightning script with nothing of @torchrun's in its training: the snapshots are the
injected callback's. What the test adds, beside the training (as hf_snapshot.py):

--kill-at S  rank 1 SIGKILLs itself at step S's end, once: $MFTR_TEST_OUT/killed marks it done.
Each rank appends to $MFTR_TEST_OUT/rank-<R>.jsonl its weights' sha256 where a start begins
({"start": global step}) and at each step's end ({"step": S}); rank 0 writes the final global step
to $MFTR_TEST_OUT/final.json. (A plain DataLoader starts its epoch again on a resume, Lightning's
way: the weights after it differ from an uninterrupted run's; those at the start must not.) Each step's
note has the RNGs' digest too (torch's, numpy's, Python's), and the module's and a callback's
on_save_checkpoint note each call ({"hook": ...}): this script takes no checkpoint of its own.
"""

import argparse
import gc
import hashlib
import json
import os
import pickle
import random
import signal

import lightning as L
import numpy
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--kill-at", type=int, default=0)
opts = parser.parse_args()
OUT = os.environ["MFTR_TEST_OUT"]
RANK = int(os.environ.get("RANK", "0"))


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def on_save_checkpoint(self, checkpoint):
        note(hook="module", step=None)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)]


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 1024

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), torch.randn(1, generator=g)


def digest(module):
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def rng_digest():
    h = hashlib.sha256(torch.random.get_rng_state().numpy().tobytes())
    h.update(pickle.dumps(numpy.random.get_state(legacy=True)))
    h.update(pickle.dumps(random.getstate()))
    return h.hexdigest()


def note(**what):
    with open(os.path.join(OUT, "rank-%d.jsonl" % RANK), "a") as f:
        f.write(json.dumps(what) + "\n")


class Witness(L.Callback):
    """The test's eyes and its failure: not a part of the training."""

    def on_train_start(self, trainer, pl_module):
        note(start=trainer.global_step, digest=digest(pl_module))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        note(step=step, digest=digest(pl_module), rng=rng_digest())
        marker = os.path.join(OUT, "killed")
        if RANK == 1 and step == opts.kill_at and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        note(hook="callback", step=None)


def train():
    torch.manual_seed(0)
    trainer = L.Trainer(max_steps=opts.steps, accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                        num_nodes=int(os.environ["WORLD_SIZE"]) // int(os.environ["LOCAL_WORLD_SIZE"]),
                        strategy="ddp", logger=False, enable_checkpointing=False, enable_model_summary=False,
                        enable_progress_bar=False, callbacks=[Witness()])
    trainer.fit(Tiny(), torch.utils.data.DataLoader(Samples(), batch_size=8))
    if RANK == 0:
        with open(os.path.join(OUT, "final.json"), "w") as f:
            json.dump({"global_step": trainer.global_step, "lr": trainer.optimizers[0].param_groups[0]["lr"]}, f)


train()
# The trainer gone before the process group, as hf_snapshot.py says why.
if torch.distributed.is_initialized():
    torch.distributed.barrier()
    gc.collect()
    torch.distributed.destroy_process_group()
