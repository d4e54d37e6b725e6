"""How fast does trainctl notice and diagnose a real DataLoader deadlock?

    .venv/bin/python bench/bench_detection.py [--runs 5] [--stall-timeout 5] [--kind worker]

Each run: `trainctl run --json --stall-timeout T --no-auto-recover -- python train_loop.py
--hang-at 2:5 --hang-kind worker` (a forked DataLoader worker blocks forever on an Event,
in epoch 2, so the workers of epoch 1 are gone), then `trainctl ctl RUN_DIR stop`.
From the journal's timestamps (one clock: the agent's):

* detection  = STALLED state − last progress − T   (the detector's lag past the threshold;
               it polls every 0.25 s)
* diagnosis  = stall event − STALLED state          (process sampling over 1 s + py-spy dumps
               of every process of the tree)
* total      = stall event − last progress − T      (what a user waits past the threshold)

Prints each run, then median and max.  The machine's load is printed too: on a crowded
2-core box py-spy and the sampling take longer.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import run_trainctl, start_trainctl  # noqa: E402
from tests.helpers.hangs import TRAIN_LOOP  # noqa: E402


def one_run(timeout: float, kind: str) -> dict[str, float | str]:
    args = [
        "run",
        "--json",
        "--stall-timeout",
        str(timeout),
        "--no-auto-recover",
        "--",
        sys.executable,
        str(TRAIN_LOOP),
        "--epochs",
        "3",
        "--batches",
        "20",
        "--batch-time",
        "0.05",
        "--hang-at",
        "2:5",
        "--hang-kind",
        kind,
    ]
    with start_trainctl(args) as tc:
        stall = tc.wait_event("stall", 120 + timeout)
        events = tc.events()
        stalled = [e for e in events if e.type == "state" and e.state == "STALLED"][-1]
        last = [e for e in events if e.type == "progress" and e.seq < stall.seq][-1]
        run_trainctl(["ctl", str(tc.run_dir), "stop"], timeout=30)
        result = tc.wait(30)
    return {
        "detection": stalled.ts - last.ts - timeout,
        "diagnosis": stall.ts - stalled.ts,
        "total": stall.ts - last.ts - timeout,
        "verdict": stall.diagnosis,
        "rc": result.returncode,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--stall-timeout", type=float, default=5.0)
    ap.add_argument(
        "--kind",
        default="worker",
        choices=("worker", "main", "spin", "stop"),
        help="train_loop.py --hang-kind (default: worker = DataLoader deadlock)",
    )
    a = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="bench-detection-"))
    os.environ.setdefault("TRAINCTL_RUNS_DIR", str(home / "runs"))
    os.environ.setdefault("TRAINCTL_CONFIG_DIR", str(home / "config"))
    print(
        f"real {a.kind} hang under trainctl, stall timeout {a.stall_timeout:g}s, {a.runs} runs; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    rows = []
    for i in range(1, a.runs + 1):
        row = one_run(a.stall_timeout, a.kind)
        rows.append(row)
        print(
            f"  run {i}: detection {row['detection']:.2f}s  diagnosis {row['diagnosis']:.2f}s  "
            f"total {row['total']:.2f}s  → {row['verdict']} (exit {row['rc']})",
            flush=True,
        )
    for key in ("detection", "diagnosis", "total"):
        values = [float(r[key]) for r in rows]
        print(f"{key:10} median {statistics.median(values):.2f}s  max {max(values):.2f}s")
    verdicts = {str(r["verdict"]) for r in rows}
    print(f"verdicts: {', '.join(sorted(verdicts))}; load average now {os.getloadavg()[0]:.2f}")
    shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
