"""A plain PyTorch script with its own DataLoader settings (2 forked workers, prefetch 4)
and a torch.compile call, that knows nothing of trainctl: what a preset does to it.

    python own_loaders.py [...] STEPS

Prints ``compiled <bool>`` (whether torch.compile gave back something else than the
model), then ``step i/STEPS loss=...`` every 0.05 s, each batch from the DataLoader."""

import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    steps = int(sys.argv[-1])
    model = torch.nn.Linear(4, 1)
    print("compiled", torch.compile(model) is not model, flush=True)
    data = TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
    loader = DataLoader(data, batch_size=2, num_workers=2, multiprocessing_context="fork", prefetch_factor=4)
    step = 0
    while step < steps:
        for xb, yb in loader:
            step += 1
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            print(f"step {step}/{steps} loss={loss.item():.4f}", flush=True)
            time.sleep(0.05)
            if step >= steps:
                break


if __name__ == "__main__":
    main()
