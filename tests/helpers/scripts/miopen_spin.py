"""Prints the MIOpen missing-kernel-database warning (as the users' ROCm runs did before
they hung), then spins the CPU without printing progress — like a kernel search or a hang
before the first batch.

Usage: python miopen_spin.py [--spin-s S] [--epochs N] [--batches N] [--batch-time S]
  --spin-s S      spin S seconds, then run a steady loop (--epochs x --batches lines of
                  "epoch=E/EE batch=B/BB loss=X"); default: spin forever
Output on stdout (flushed): "start pid=P", the MIOpen warning (one line, as MIOpen prints
it), then nothing while spinning.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

WARNING = (
    "MIOpen(HIP): Warning [SQLiteBase] Missing system database file: gfx1030_18.kdb "
    "Performance may degrade. Please follow instructions to install: "
    "https://github.com/ROCmSoftwarePlatform/MIOpen#installing-miopen-kernels-package"
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spin-s", type=float, default=None)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--batch-time", type=float, default=0.05)
    a = p.parse_args(argv)
    print(f"start pid={os.getpid()}", flush=True)
    print(WARNING, flush=True)
    end = None if a.spin_s is None else time.monotonic() + a.spin_s
    n = 0
    while end is None or time.monotonic() < end:
        n += 1  # busy: ~100% of one core, no output
    for epoch in range(1, a.epochs + 1):
        for b in range(1, a.batches + 1):
            time.sleep(a.batch_time)
            print(f"epoch={epoch}/{a.epochs} batch={b}/{a.batches} loss=1.0", flush=True)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
