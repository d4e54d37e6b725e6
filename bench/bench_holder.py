"""The holder's own cost (src/trainctl/holder/main.py): start overhead and CPU while relaying lines.

    .venv/bin/python bench/bench_holder.py [--starts 10] [--seconds 10] [--rates 50,500]

Prints figures; asserts nothing.

1. Start overhead: the time from ``HeldTrainer.start`` being called to its return (the
   status file names the trainer's pid), for a trainer that is ``/bin/true`` (median, max).
   It is mostly the holder's interpreter start and imports.
2. CPU: a generator writes one flushed line at RATE lines/s for SECONDS; the holder's own
   user + system CPU (psutil cpu_times, not its children) is read once the trainer runs and
   again just before it ends. "% core" is that CPU over the window's wall time. The holder's
   CPU from its start to the trainer running (interpreter + imports) is printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainctl.holder.handle import HeldTrainer  # noqa: E402

GEN = """
import sys, time
rate, seconds = float(sys.argv[1]), float(sys.argv[2])
t0 = time.monotonic()
i = 0
while (now := time.monotonic()) < t0 + seconds:
    print(f"epoch=1/3 batch={i}/100000 loss=0.{i % 10000:04d}", flush=True)
    i += 1
    time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
"""


def cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


async def starts(n: int) -> None:
    took = []
    for k in range(n):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.monotonic()
            ht = await HeldTrainer.start(["/bin/true"], None, None, d, 1)
            took.append(time.monotonic() - t0)
            await ht.wait()
    print(
        f"start overhead ({n} starts): median {1000 * statistics.median(took):.0f} ms, "
        f"max {1000 * max(took):.0f} ms"
    )


async def load(rate: float, seconds: float) -> None:
    with tempfile.TemporaryDirectory() as d:
        ht = await HeldTrainer.start([sys.executable, "-c", GEN, str(rate), str(seconds)], None, None, d, 1)
        holder = psutil.Process(ht.holder_pid)
        c0, t0 = cpu(holder), time.monotonic()
        await asyncio.sleep(seconds - 0.3)
        c1, t1 = cpu(holder), time.monotonic()
        await ht.wait()
        lines = ht.status()["log_bytes"] and Path(d, "train.log").read_bytes().count(b"\n")
        print(
            f"{rate:g} lines/s for {seconds:g}s ({lines} lines): holder CPU in the window "
            f"{1000 * (c1 - c0):.0f} ms = {100 * (c1 - c0) / (t1 - t0):.2f} % of a core; "
            f"{1e6 * (c1 - c0) / max(1, rate * (t1 - t0)):.0f} µs/line; "
            f"CPU to start: {1000 * c0:.0f} ms"
        )


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rates", default="50,500")
    a = ap.parse_args()
    print(f"cpus {os.cpu_count()}, load {os.getloadavg()[0]:.2f}")
    await starts(a.starts)
    for rate in a.rates.split(","):
        await load(float(rate), a.seconds)


if __name__ == "__main__":
    asyncio.run(main())
