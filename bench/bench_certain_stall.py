"""Seconds from the last batch to the stall, for each hang the process tree proves, with the
defaults (core/stall_certain.py; no --stall-timeout, nothing tuned).

    .venv/bin/python bench/bench_certain_stall.py [--runs 1]

Each run is `trainctl run --json --no-auto-recover -- python SCRIPT ...`, ended with
`trainctl ctl RUN_DIR stop`:

* workers stopped:  train_loop.py (2 forked DataLoader workers); both SIGSTOPped at batch 20
* trainer stopped:  steady.py --hang-kind stop (the trainer SIGSTOPs itself at batch 20)
* worker killed:    steady.py --mp-workers 1; its producer SIGKILLed at batch 20 (a zombie
                    next to a trainer blocked on the queue)
* deadlock:         train_loop.py --hang-at 2:5 --hang-kind worker (a worker blocks on an
                    Event; the workers of epoch 1 were replaced at its end)

Printed per run: ``idle`` = the stall event's ``idle_s`` (the detector's seconds since the
last batch it read, the figure the goals are about), ``journal`` = the stall's timestamp −
the last progress event's in the journal (journaled progress is throttled: an upper bound),
the rule that called it (``certain``) and its window.  The table goes through
bench/doc_tables.py (``--docs``: into docs/benchmarks.md, block ``certain-stall``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import run_trainctl, start_trainctl  # noqa: E402
from tests.helpers.hangs import STEADY, TRAIN_LOOP  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from doc_tables import Recorder, add_docs_flag  # noqa: E402

DOC_TABLES = {"certain-stall": ("case", "idle s", "journal s", "rule (window)")}

LOOP = ["--epochs", "1", "--batches", "5000", "--batch-time", "0.02"]
DEADLOCK = "--epochs 3 --batches 20 --batch-time 0.05 --hang-at 2:5 --hang-kind worker".split()
CASES = {
    "workers stopped (2 forked DataLoader workers SIGSTOPped)": ([str(TRAIN_LOOP), *LOOP], "stop-workers"),
    "trainer stopped (SIGSTOP)": ([str(STEADY), *LOOP, "--hang-at", "1:20", "--hang-kind", "stop"], None),
    "worker killed (a queue's producer SIGKILLed: a zombie)": (
        [str(STEADY), *LOOP, "--mp-workers", "1"],
        "kill-worker",
    ),
    "deadlock (a DataLoader worker blocked on an Event, epoch 2)": ([str(TRAIN_LOOP), *DEADLOCK], None),
}


def one_run(argv: list[str], act: str | None) -> dict[str, object]:
    with start_trainctl(["run", "--json", "--no-auto-recover", "--", sys.executable, *argv]) as tc:
        start = tc.wait_event("start", 60)
        if act is not None:
            tc.wait_event(lambda e: e.type == "progress" and (e.batch or 0) >= 20, 60, "batch 20")
            children = psutil.Process(start.pid).children()
            for w in children if act == "stop-workers" else children[:1]:
                w.send_signal(signal.SIGSTOP if act == "stop-workers" else signal.SIGKILL)
        stall = tc.wait_event("stall", 180)
        last = [e for e in tc.events() if e.type == "progress" and e.seq < stall.seq][-1]
        run_trainctl(["ctl", str(tc.run_dir), "stop"], timeout=30)
        tc.wait(30)
    return {
        "idle": stall.idle_s,
        "journal": stall.ts - last.ts,
        "certain": stall.certain or "(threshold)",
        "window": stall.threshold_s,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    add_docs_flag(ap)
    a = ap.parse_args()
    rec = Recorder(DOC_TABLES, a.docs)
    home = Path(tempfile.mkdtemp(prefix="bench-certain-"))
    os.environ.setdefault("TRAINCTL_RUNS_DIR", str(home / "runs"))
    os.environ.setdefault("TRAINCTL_CONFIG_DIR", str(home / "config"))
    rows: list[list[object]] = []
    for name, (argv, act) in CASES.items():
        for _ in range(a.runs):
            row = one_run(argv, act)
            rows.append(
                [
                    name,
                    f"{row['idle']:.1f}",
                    f"{row['journal']:.1f}",
                    f"{row['certain']} ({row['window']:g} s)",
                ]
            )
            print(" | ".join(map(str, rows[-1])), flush=True)
    rec.publish("certain-stall", rows)
    shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
