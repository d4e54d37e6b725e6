"""A fault injector for the ladder: examples/midepoch_resume.py (a real PyTorch loop with real
DataLoader workers, mid-epoch saves, save requests, resume inside an epoch) whose speed and
hang rate depend on its DataLoader workers, as trainctl's preset sets them
(``TRAINCTL_WORKERS``, exported from the preset's ``[dataloader] workers``).

    trainctl run trainctl.toml      # with: preset = "A", [ladder] workers = [4, 2, 0]
    command = ["python", "examples/ladder_faults.py", "--rates", "4:0.01,2:0.001,0:0",
               "--batch-times", "4:0.02,2:0.03,0:0.05"]

``--rates W:P,...``: the chance that any one batch hangs (a DataLoader worker blocked forever)
with W workers; the batch of the next hang is drawn once per attempt (a geometric draw,
seeded by ``--seed`` and the attempt), counted from where the attempt resumes.
``--batch-times W:S,...``: seconds per batch with W workers (more workers, faster).
``--hang-attempts N``: hangs only in the first N attempts (0: every attempt).  The other
flags go to midepoch_resume (``--epochs``, ``--batches``, ``--checkpoint-dir``, ``--resume``).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def per_workers(text: str) -> dict[int, float]:
    """``"4:0.01,2:0.001"`` as ``{4: 0.01, 2: 0.001}``."""
    out: dict[int, float] = {}
    for part in text.split(","):
        w, _, v = part.partition(":")
        out[int(w)] = float(v)
    return out


def draw_hang(p: float, seed: int, attempt: int) -> int | None:
    """Batches until the next hang (1-based), or None when ``p`` is 0: geometric, seeded."""
    if p <= 0:
        return None
    u = random.Random(seed * 1_000_003 + attempt).random()
    return 1 + int(math.log(1.0 - u) / math.log(1.0 - min(p, 0.999999)))


def resumed_at(resume: str | None, batches: int) -> tuple[int, int]:
    """(epoch, batch done) a checkpoint holds; (1, 0) without one."""
    if not resume or not Path(resume).is_file():
        return 1, 0
    import torch

    ck = torch.load(resume, weights_only=False)
    epoch, done = int(ck["epoch"]), int(ck["batch"])
    return (epoch + 1, 0) if done >= batches else (epoch, done)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="0:0")
    p.add_argument("--batch-times", default="0:0.05")
    p.add_argument("--hang-attempts", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--resume", default=None)
    args, rest = p.parse_known_args(argv)
    workers = int(os.environ.get("TRAINCTL_WORKERS", "0"))
    attempt = int(os.environ.get("TRAINCTL_ATTEMPT", "1"))
    rate = per_workers(args.rates).get(workers, 0.0)
    batch_time = per_workers(args.batch_times).get(workers, 0.05)
    hang_in = draw_hang(rate, args.seed, attempt)
    if args.hang_attempts and attempt > args.hang_attempts:
        hang_in = None
    forward = [*rest, "--workers", str(workers), "--batch-time", str(batch_time), "--seed", str(args.seed)]
    forward += ["--batches", str(args.batches), "--epochs", str(args.epochs)]
    if args.resume:
        forward += ["--resume", args.resume]
    if hang_in is not None and workers > 0:  # a worker to block: the hang is a worker deadlock
        epoch, done = resumed_at(args.resume, args.batches)
        g = (epoch - 1) * args.batches + done + hang_in
        hang_epoch, hang_batch = divmod(g - 1, args.batches)
        if hang_epoch < args.epochs:
            forward += ["--hang-at", f"{hang_epoch + 1}:{hang_batch + 1}", "--hang-kind", "worker"]
    print(f"ladder_faults workers={workers} batch_time={batch_time} hang_in={hang_in}", flush=True)
    sys.path.insert(0, str(HERE))
    import midepoch_resume

    return midepoch_resume.main(forward)


if __name__ == "__main__":
    sys.exit(main())
