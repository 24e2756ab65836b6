"""A plain HF Trainer script, as a user writes it: nothing of @torchrun's in it.
A one-layer BERT built from a config (no download), a few steps on CPU."""

import tempfile
import time

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

STEPS = 12


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        time.sleep(0.1)  # read from somewhere, as a real dataset is: 12 steps take a few seconds
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 64, (8,), generator=g), "labels": torch.tensor(i % 2)}


config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=16, num_labels=2)
args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=STEPS, per_device_train_batch_size=4,
                         logging_steps=1, learning_rate=1e-3, report_to=[], save_strategy="no", use_cpu=True)
Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=Tokens()).train()
