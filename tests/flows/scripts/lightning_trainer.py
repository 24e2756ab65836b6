"""A plain Lightning script, as a user writes it: nothing of @torchrun's in it.
A tiny model, a few steps on CPU with DDP (gloo)."""

import os
import time

import lightning as L
import torch

STEPS = 12


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        time.sleep(0.05)  # read from somewhere, as a real dataset is: 12 steps take a few seconds
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), torch.randn(1, generator=g)


data = Samples()
trainer = L.Trainer(max_steps=STEPS, accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), num_nodes=2, strategy="ddp",
                    logger=False, enable_checkpointing=False, enable_model_summary=False)
trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8))
