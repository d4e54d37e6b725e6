"""A plain PyTorch script that imports none of the integrated libraries: it prints what it
sees of its own interpreter (trainctl modules, sys.path, PYTHONPATH)
and a deterministic training, for a byte-for-byte comparison with and without trainctl.

    python plain_torch.py"""

import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, num_workers=2)
    for epoch in range(2):
        for i, (xb, yb) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"epoch={epoch + 1}/2 batch={i + 1}/{len(loader)} loss={loss.item():.6f}", flush=True)
    print("trainctl modules:", sorted(m for m in sys.modules if m.split(".")[0] == "trainctl"))
    print("PYTHONPATH:", os.environ.get("PYTHONPATH"))
    print("TRAINCTL_INSTRUMENT" in os.environ, [p for p in sys.path if "instrument" in p])


if __name__ == "__main__":
    main()
