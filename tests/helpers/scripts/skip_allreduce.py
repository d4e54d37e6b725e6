"""A torchrun loop (gloo, CPU) whose every batch is one ``dist.all_reduce``; one rank skips
the all_reduce of one batch and waits for ever in its own code: a real deadlock, its peers
blocked in a collective it never entered.  Progress on the side channel.

Usage: torchrun --standalone --nproc-per-node 2 skip_allreduce.py RANK BATCH [BATCHES]
"""

from __future__ import annotations

import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from trainctl.inside import report


def main(argv: list[str]) -> int:
    skip_rank, skip_at = int(argv[0]), int(argv[1])
    batches = int(argv[2]) if len(argv) > 2 else 40
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    report.report_phase("train")
    for batch in range(1, batches + 1):
        grad = torch.ones(16)
        if rank == skip_rank and batch == skip_at:
            threading.Event().wait()  # the all_reduce skipped: never entered
        dist.all_reduce(grad)
        time.sleep(0.05)
        report.report_progress(1, 1, batch, batches, {"loss": 1.0 / batch})
    report.report_phase("finished")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
