"""A user's plain Transformers ``Trainer`` script (nothing of trainctl in it), for the
zero-code e2e tests: a tiny GPT-2 built from a config (no download) on random tokens.

Usage: python hf_trainer.py OUT_DIR [options]
  --epochs N        epochs (2); --items N: samples (64); batch 4 => 16 optimizer steps an epoch
  --save-steps N    the Trainer's own checkpoint-<step> every N steps (4)
  --workers N       dataloader_num_workers written in the script (2)
  --load-time S     seconds a sample takes to load (0.01)
  --hang-step K     the DataLoader worker loading step K's batch blocks forever (needs workers)
  --hang-attempt A  ... only when env TRAINCTL_ATTEMPT == A (default 1)
Prints "start attempt=A workers=W" and "done global_step=G".
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

BATCH = 4


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, load_time: float, hang_batch: int | None) -> None:
        self.n, self.load_time, self.hang_batch = n, load_time, hang_batch
        self.loaded = 0  # in each worker: the samples it loaded (batches go round-robin)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        info = torch.utils.data.get_worker_info()
        if info is not None and self.hang_batch is not None:
            batch = (self.loaded // BATCH) * info.num_workers + info.id
            self.loaded += 1
            if batch == self.hang_batch:
                threading.Event().wait()  # forever: the main thread waits for this batch
        time.sleep(self.load_time)
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--items", type=int, default=64)
    p.add_argument("--save-steps", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--load-time", type=float, default=0.01)
    p.add_argument("--hang-step", type=int, default=None)
    p.add_argument("--hang-attempt", type=int, default=1)
    a = p.parse_args()
    attempt = int(os.environ.get("TRAINCTL_ATTEMPT", "1"))
    hang = a.hang_step - 1 if a.hang_step and attempt == a.hang_attempt else None
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16, bos_token_id=0, eos_token_id=0
        )
    )
    args = TrainingArguments(
        output_dir=a.out,
        num_train_epochs=a.epochs,
        per_device_train_batch_size=BATCH,
        logging_steps=1,
        save_steps=a.save_steps,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=a.workers,
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(a.items, a.load_time, hang))
    print(f"start attempt={attempt} workers={trainer.args.dataloader_num_workers}", flush=True)
    out = trainer.train()
    print(f"done global_step={out.global_step}", flush=True)


if __name__ == "__main__":
    main()
