"""A small real PyTorch training loop with a DataLoader, for hang, stall and recovery tests.

Usage: python train_loop.py [options]   (every option is optional)
  --epochs N           epochs (3)
  --batches N          batches per epoch (30)
  --batch-time S       seconds the main loop spends per batch (0.05)
  --load-time S        seconds a DataLoader worker spends per batch (0.0)
  --val-time S         silent "validation" after each epoch, no output, CPU-busy (0.0)
  --first-load-time S  a worker computes S seconds (CPU-busy) loading the first batch of
                       every epoch after the first (a slow first batch after validation)
  --workers N          DataLoader workers (env TRAIN_WORKERS, else the preset's TRAINCTL_WORKERS
                       that trainctl exports, else 2); 0 = load in the main process
  --mp-context C       fork | spawn | forkserver (env TRAIN_MP_CONTEXT, else the preset's
                       TRAINCTL_MP_CONTEXT, else fork); the preset's TRAINCTL_PERSISTENT_WORKERS
                       (0/1) and TRAINCTL_PREFETCH_FACTOR also apply when workers > 0
  --hang-at E:B        hang at epoch E, batch B (1-based); default: never
  --hang-kind K        what happens there (worker):
                         worker       the worker loading batch B blocks forever on an Event: the
                                      main thread waits in DataLoader._get_data at ~0% CPU
                         main         the main thread blocks forever on an Event
                         spin         the main thread spins (while True: pass)
                         stop         the process SIGSTOPs itself
                         worker-exit  the worker loading batch B dies (os._exit): torch raises
                                      "DataLoader worker ... exited unexpectedly" in the main process
                         crash        the main process exits with code 3
                         val          the main thread blocks forever on an Event as the
                                      validation after epoch E begins (B is ignored)
  --hang-attempt N     hang only when env TRAINCTL_ATTEMPT == N (default: on every attempt)
  --checkpoint PATH    after each epoch write {"epoch": E} there (atomically)
  --resume PATH        start after the epoch saved in PATH (a missing file: from the start)
  --save-time S        write the checkpoint in place (not atomically) and slowly: half, sleep S,
                       the rest; reports phase "save" around it on trainctl's side channel
                       (trainctl.inside.report) and prints "save begin/end epoch=E"
Hangs "worker" and "val" write when they began to $TRAINCTL_RUN_DIR/hang_at.
Output on stdout (flushed): "env OMP_NUM_THREADS=.. TRAINCTL_PRESET=.. TRAINCTL_WORKERS=.. ..."
(the preset-related variables it sees, "-" when unset),
"start pid=P attempt=A workers=W context=C resume_epoch=R",
one "epoch=E/EE batch=B/BB loss=X" per batch, "checkpoint epoch=E path=P", "done".
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset

SEEN_ENV = (
    "OMP_NUM_THREADS",
    "TRAINCTL_PRESET",
    "TRAINCTL_WORKERS",
    "TRAINCTL_MP_CONTEXT",
    "TRAINCTL_PERSISTENT_WORKERS",
    "TRAINCTL_PREFETCH_FACTOR",
    "TRAINCTL_ATTEMPT",
)


def _pair(text: str) -> tuple[int, int]:
    e, _, b = text.partition(":")
    return int(e), int(b)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batches", type=int, default=30)
    p.add_argument("--batch-time", type=float, default=0.05)
    p.add_argument("--load-time", type=float, default=0.0)
    p.add_argument("--val-time", type=float, default=0.0)
    p.add_argument("--first-load-time", type=float, default=0.0)
    p.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("TRAIN_WORKERS") or os.environ.get("TRAINCTL_WORKERS") or 2),
    )
    p.add_argument(
        "--mp-context",
        default=os.environ.get("TRAIN_MP_CONTEXT") or os.environ.get("TRAINCTL_MP_CONTEXT") or "fork",
        choices=("fork", "spawn", "forkserver"),
    )
    p.add_argument("--hang-at", type=_pair, default=None)
    p.add_argument(
        "--hang-kind",
        default="worker",
        choices=("worker", "main", "spin", "stop", "worker-exit", "crash", "val"),
    )
    p.add_argument("--hang-attempt", type=int, default=None)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--resume", default=None)
    p.add_argument("--save-time", type=float, default=0.0)
    return p.parse_args(argv)


def note_hang() -> None:
    """Write when the hang began to $TRAINCTL_RUN_DIR/hang_at (tests measure from it)."""
    run_dir = os.environ.get("TRAINCTL_RUN_DIR")
    if run_dir:
        with open(os.path.join(run_dir, "hang_at"), "w") as f:
            f.write(repr(time.time()))


class Batches(Dataset):
    """One item = one batch; ``epoch`` is set before each epoch's iterator is made, so the
    (re-created) workers know where they are."""

    def __init__(self, n: int, load_time: float, hang: tuple[int, int] | None, kind: str) -> None:
        self.n, self.load_time, self.hang, self.kind = n, load_time, hang, kind
        self.epoch = 1
        self.first_load_time = 0.0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.hang == (self.epoch, i + 1):
            if self.kind == "worker":
                note_hang()
                threading.Event().wait()  # forever
            elif self.kind == "worker-exit":
                os._exit(7)
        if self.load_time:
            time.sleep(self.load_time)
        if self.first_load_time and i == 0 and self.epoch > 1:
            end = time.monotonic() + self.first_load_time
            while time.monotonic() < end:
                sum(range(10000))
        g = torch.Generator().manual_seed(self.epoch * 1000 + i)
        x = torch.randn(16, 8, generator=g)
        return x, x.sum(dim=1, keepdim=True)


def slow_save(path: str, epoch: int, seconds: float) -> None:
    """Write {"epoch": E} in place in two halves, ``seconds`` apart (a kill in between
    leaves a truncated file), inside phase "save" on trainctl's side channel."""
    from trainctl.inside.report import report_checkpoint, saving

    text = json.dumps({"epoch": epoch})
    with saving():
        print(f"save begin epoch={epoch}", flush=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text[: len(text) // 2])
            f.flush()
            time.sleep(seconds)
            f.write(text[len(text) // 2 :])
        print(f"save end epoch={epoch}", flush=True)
    report_checkpoint(path, epoch)
    print(f"checkpoint epoch={epoch} path={path}", flush=True)


def main(argv=None) -> int:
    a = parse_args(argv)
    attempt = int(os.environ.get("TRAINCTL_ATTEMPT", "1") or 1)
    hang = a.hang_at if (a.hang_attempt is None or a.hang_attempt == attempt) else None
    start_epoch = 1
    if a.resume and os.path.isfile(a.resume):
        with open(a.resume, encoding="utf-8") as f:
            start_epoch = int(json.load(f)["epoch"]) + 1
    torch.set_num_threads(1)
    print("env " + " ".join(f"{k}={os.environ.get(k) or '-'}" for k in SEEN_ENV), flush=True)
    print(
        f"start pid={os.getpid()} attempt={attempt} workers={a.workers} context={a.mp_context} "
        f"resume_epoch={start_epoch - 1}",
        flush=True,
    )
    data = Batches(
        a.batches, a.load_time, hang if a.hang_kind in ("worker", "worker-exit") else None, a.hang_kind
    )
    kw = {"num_workers": a.workers, "batch_size": None}
    if a.workers > 0:
        kw["multiprocessing_context"] = a.mp_context
        if os.environ.get("TRAINCTL_PERSISTENT_WORKERS"):
            kw["persistent_workers"] = os.environ["TRAINCTL_PERSISTENT_WORKERS"] == "1"
        if os.environ.get("TRAINCTL_PREFETCH_FACTOR"):
            kw["prefetch_factor"] = int(os.environ["TRAINCTL_PREFETCH_FACTOR"])
    data.first_load_time = a.first_load_time
    loader = DataLoader(data, **kw)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(start_epoch, a.epochs + 1):
        data.epoch = epoch
        for b, (x, y) in enumerate(loader, start=1):
            if hang == (epoch, b):
                if a.hang_kind == "main":
                    threading.Event().wait()
                elif a.hang_kind == "spin":
                    while True:
                        pass
                elif a.hang_kind == "stop":
                    os.kill(os.getpid(), signal.SIGSTOP)
                elif a.hang_kind == "crash":
                    print(f"crash at epoch={epoch} batch={b}", flush=True)
                    return 3
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if a.batch_time:
                time.sleep(a.batch_time)
            print(f"epoch={epoch}/{a.epochs} batch={b}/{a.batches} loss={loss.item():.4f}", flush=True)
        if a.val_time:
            if hang is not None and a.hang_kind == "val" and hang[0] == epoch:
                note_hang()
                threading.Event().wait()
            end = time.monotonic() + a.val_time  # a validation computes: busy, silent
            with torch.no_grad():
                while time.monotonic() < end:
                    model(torch.randn(256, 8))
        if a.checkpoint and a.save_time:
            slow_save(a.checkpoint, epoch, a.save_time)
        elif a.checkpoint:
            tmp = f"{a.checkpoint}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"epoch": epoch}, f)
            os.replace(tmp, a.checkpoint)
            print(f"checkpoint epoch={epoch} path={a.checkpoint}", flush=True)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
