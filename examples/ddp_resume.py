"""A tiny DistributedDataParallel loop for torchrun (gloo on CPU, or NCCL): every rank reports
its progress to trainctl, rank 0 saves checkpoints, and a restart resumes from one.

    trainctl run --resume-arg=--resume --resume-arg={checkpoint} -- \\
        torchrun --standalone --nproc-per-node 2 examples/ddp_resume.py --checkpoint-dir ckpts

or a job file with ``kind = "torchrun"`` (README, "torchrun jobs").

What it takes from trainctl (trainctl.inside.report; outside trainctl every call does nothing):
``report_progress`` per batch on every rank (the rank comes from torchrun's ``RANK``),
``saving()`` around rank 0's atomic saves, then ``report_checkpoint`` on every rank once it
is written (report.py keeps one per node: its local rank 0, so that each node's agent
restarts from it), every ``--save-every`` batches and at each epoch's end.  Resume: the model, the optimizer, the epoch and the batches done
in it; each rank skips the batches done (a DistributedSampler with the epoch as its seed
draws the same order again).

Test flags: ``--hang-rank R --hang-at E:B`` (1-based): the DataLoader worker of rank R that
loads batch B of epoch E blocks forever (a real worker deadlock: rank R waits for the batch,
the others wait for rank R in the next allreduce); ``--hang-if-env VAR`` (or ``VAR=VALUE``): instead of a rank,
wherever VAR is set (or is VALUE: ``SLURM_NODEID=1``, the second node of a Slurm job); ``--hang-attempt N``: only in attempt N
(TRAINCTL_ATTEMPT).  Prints ``resume epoch=E batch=B workers=W`` at start and one
``epoch=E/EE batch=B/BB loss=X`` per batch.  The preset's DataLoader workers reach every
rank through the environment (``TRAINCTL_WORKERS``).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from midepoch_resume import save  # the same atomic save (this directory is on sys.path)
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from trainctl.inside import report


class Synthetic(Dataset):
    def __init__(self, n: int, hang_index: int | None) -> None:
        self.n, self.hang_index = n, hang_index

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.hang_index:
            threading.Event().wait()  # a worker deadlock: blocks forever
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, generator=g)
        return x, x.sum().reshape(1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batches", type=int, default=20, help="batches per epoch and rank")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--batch-time", type=float, default=0.05)
    p.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("TRAINCTL_WORKERS", "1")),
        help="DataLoader workers per rank (default: the preset's, TRAINCTL_WORKERS, else 1)",
    )
    p.add_argument("--save-every", type=int, default=5, help="periodic save every N batches (0: off)")
    p.add_argument("--checkpoint-dir", type=Path, default=Path("ckpts"))
    p.add_argument("--resume", type=Path, default=None)
    p.add_argument("--hang-rank", type=int, default=1)
    p.add_argument("--hang-at", default="")
    p.add_argument("--hang-attempt", type=int, default=0)
    p.add_argument(
        "--hang-if-env",
        default="",
        metavar="VAR[=VALUE]",
        help="hang only where VAR is set, or is VALUE (one node of several: ranks "
        "are numbered by the rendezvous)",
    )
    args = p.parse_args(argv)

    backend = "nccl" if torch.cuda.is_available() and os.environ.get("DDP_BACKEND") != "gloo" else "gloo"
    dist.init_process_group(backend, timeout=timedelta(minutes=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    epoch, done = 1, 0
    if args.resume is not None and args.resume.is_file():
        ck = torch.load(args.resume, weights_only=False)
        model.module.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        epoch, done = ck["epoch"], ck["batch"]
        if done >= args.batches:
            epoch, done = epoch + 1, 0
    print(f"resume epoch={epoch} batch={done} workers={args.workers}", flush=True)
    if rank == 0:
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)

    def save_now(kind: str, batch: int) -> None:
        dist.barrier()  # every rank finished the same step
        path = args.checkpoint_dir / f"{kind}.pt"
        if rank == 0:
            with report.saving():
                save(
                    path,
                    {
                        "model": model.module.state_dict(),
                        "opt": opt.state_dict(),
                        "epoch": epoch,
                        "batch": batch,
                    },
                )
            print(f"checkpoint kind={kind} epoch={epoch} batch={batch}", flush=True)
        dist.barrier()  # written: every node's agent may resume from it
        report.report_checkpoint(
            path, epoch, batch=batch if batch < args.batches else None, kind=kind
        )  # said once per node (local rank 0, see report.py)

    hang_e, _, hang_b = args.hang_at.partition(":")
    var, eq, value = args.hang_if_env.partition("=")
    here = os.environ.get(var) == value if eq else bool(os.environ.get(var))
    hanging = (
        bool(args.hang_at)
        and (rank == args.hang_rank if not args.hang_if_env else here)
        and (not args.hang_attempt or os.environ.get("TRAINCTL_ATTEMPT") == str(args.hang_attempt))
    )
    n = args.batches * args.batch_size * world
    while epoch <= args.epochs:
        sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=0)
        sampler.set_epoch(epoch)
        order = list(sampler)
        hang_index = None
        if hanging and int(hang_e) == epoch and int(hang_b) > done:
            hang_index = order[(int(hang_b) - 1) * args.batch_size]
        loader = DataLoader(
            Synthetic(n, hang_index),
            batch_size=args.batch_size,
            sampler=order[done * args.batch_size :],
            num_workers=args.workers,
        )
        report.report_phase("train")
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(args.batch_time)
            done += 1
            print(
                f"epoch={epoch}/{args.epochs} batch={done}/{args.batches} loss={loss.item():.4f}", flush=True
            )
            report.report_progress(epoch, args.epochs, done, args.batches, {"loss": loss.item()})
            if args.save_every and done % args.save_every == 0 and done < args.batches:
                save_now("periodic", done)
        save_now("epoch", done)
        epoch, done = epoch + 1, 0
    report.report_phase("finished")
    dist.destroy_process_group()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
