"""A DDP loop for torchrun (gloo, CPU) that prints a format trainctl has no reader for and
reports nothing on the side channel (issue 26): a tqdm-like line with no bar characters and
no ``<remaining``, its rank prefixed by the script itself::

    [rank0] Epoch 2/3:  25%| 5/20 [00:00, 17.14it/s, loss=1.3007]

Usage: torchrun --standalone --nproc-per-node 2 ddp_unknown.py [options]
  --epochs N --batches N --batch-time S   (3, 20, 0.05)
  --hang-rank R --hang-at E:B   the DataLoader worker of rank R loading batch B of epoch E
                                blocks forever (its peers then wait in the next allreduce)
  --format F   unknown (the line above, default) | silent (no line per batch at all)
When the hang begins the hanging rank writes time.time() to $TRAINCTL_RUN_DIR/hang_at.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class Synthetic(Dataset):
    def __init__(self, n: int, hang_index: int | None) -> None:
        self.n, self.hang_index = n, hang_index

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.hang_index:
            run_dir = os.environ.get("TRAINCTL_RUN_DIR")
            if run_dir:
                with open(os.path.join(run_dir, "hang_at"), "w") as f:
                    f.write(repr(time.time()))
            threading.Event().wait()  # a worker deadlock: blocks forever
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, generator=g)
        return x, x.sum().reshape(1)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--batch-time", type=float, default=0.05)
    p.add_argument("--hang-rank", type=int, default=1)
    p.add_argument("--hang-at", default="")
    p.add_argument("--format", default="unknown")
    args = p.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(minutes=30))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hang_e, _, hang_b = args.hang_at.partition(":")
    for epoch in range(1, args.epochs + 1):
        hang_index = None
        if args.hang_at and rank == args.hang_rank and int(hang_e) == epoch:
            hang_index = int(hang_b) - 1
        loader = DataLoader(Synthetic(args.batches, hang_index), batch_size=1, num_workers=1)
        t0 = time.monotonic()
        for done, (x, y) in enumerate(loader, 1):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(args.batch_time)
            rate = done / max(time.monotonic() - t0, 1e-6)
            if args.format == "unknown":
                print(
                    f"[rank{rank}] Epoch {epoch}/{args.epochs}: {100 * done // args.batches:3d}%| "
                    f"{done}/{args.batches} [00:00, {rate:.2f}it/s, loss={loss.item():.4f}]",
                    flush=True,
                )
    dist.destroy_process_group()
    print(f"[rank{rank}] done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
