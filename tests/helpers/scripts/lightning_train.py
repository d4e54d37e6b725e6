"""A user's plain Lightning script (nothing of trainctl in it), for the zero-code e2e
tests: a tiny LightningModule on random tensors, ModelCheckpoint every few steps.

Usage: python lightning_train.py OUT_DIR [options]
  --package P       lightning (default) or pytorch_lightning
  --epochs N        epochs (2); --items N: samples (64); batch 4 => 16 batches an epoch
  --save-steps N    ModelCheckpoint(every_n_train_steps=N) into OUT_DIR (4)
  --workers N       num_workers written in the script's DataLoader (2)
  --load-time S     seconds a sample takes to load (0.01)
  --hang-batch K    the DataLoader worker loading batch K (1-based) blocks forever
  --hang-attempt A  ... only when env TRAINCTL_ATTEMPT == A (default 1)
Prints "start attempt=A" and "done global_step=G".
"""

from __future__ import annotations

import argparse
import importlib
import os
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset

BATCH = 4


class Samples(Dataset):
    def __init__(self, n: int, load_time: float, hang_batch: int | None) -> None:
        self.n, self.load_time, self.hang_batch = n, load_time, hang_batch

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if (
            self.hang_batch is not None
            and i == (self.hang_batch - 1) * BATCH
            and torch.utils.data.get_worker_info() is not None
        ):
            threading.Event().wait()  # forever: the main thread waits for this batch
        time.sleep(self.load_time)
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), torch.randn(1, generator=g)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--package", default="lightning")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--items", type=int, default=64)
    p.add_argument("--save-steps", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--load-time", type=float, default=0.01)
    p.add_argument("--hang-batch", type=int, default=None)
    p.add_argument("--hang-attempt", type=int, default=1)
    a = p.parse_args()
    L = importlib.import_module(a.package)
    callbacks = importlib.import_module(
        f"{a.package}.pytorch.callbacks" if a.package == "lightning" else f"{a.package}.callbacks"
    )
    attempt = int(os.environ.get("TRAINCTL_ATTEMPT", "1"))
    hang = a.hang_batch if attempt == a.hang_attempt else None

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    L.seed_everything(0)
    loader = DataLoader(Samples(a.items, a.load_time, hang), batch_size=BATCH, num_workers=a.workers)
    ckpt = callbacks.ModelCheckpoint(
        dirpath=a.out, every_n_train_steps=a.save_steps, save_top_k=-1, filename="{epoch}-{step}"
    )
    trainer = L.Trainer(
        max_epochs=a.epochs,
        accelerator="cpu",
        devices=1,
        callbacks=[ckpt],
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        default_root_dir=a.out,
        log_every_n_steps=1,
    )
    print(f"start attempt={attempt}", flush=True)
    trainer.fit(Tiny(), loader)
    print(f"done global_step={trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
