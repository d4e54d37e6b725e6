"""Record real process trees as the certain-evidence rules read them, for
tests/unit/test_stall_certain.py: ``tests/data/trees/<case>.json`` = one list of
:class:`~trainctl.core.stall_certain.ProcFacts` (as dicts) per second, with the main
thread's wait as py-spy reads it at the end (13 s for the deadlock, 10 for the others).

    .venv/bin/python -m tests.helpers.record_trees [CASE ...]

Cases (real scripts, no trainctl): ``deadlock`` (train_loop.py, a worker blocked on an
Event at 1:5), ``workers_stopped`` (its 2 workers SIGSTOPped mid-epoch), ``zombie``
(steady.py --mp-workers 1, the producer SIGKILLed; both faults after the second sample),
``healthy`` (train_loop.py running
2 epochs: busy batches and an epoch's end whose workers are replaced).
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import time
from pathlib import Path

import psutil

from tests.helpers.hangs import STEADY, TRAIN_LOOP, kill_group, start_script, wait_for_line
from trainctl.system.probes import TreeSampler
from trainctl.system.tree_facts import read_main_wait, tree_facts

OUT = Path(__file__).resolve().parent.parent / "data" / "trees"


def _record(proc, seconds: int, act=None) -> dict:
    """One sample a second; ``act`` (the fault) after the first two, as the agent sees a
    tree it has watched since before."""
    sampler, trees = TreeSampler(), []
    samples = ()
    for i in range(seconds):
        if i == 2 and act is not None:
            act()
        samples = sampler.sample(proc.pid)
        trees.append([dataclasses.asdict(f) for f in tree_facts(samples)])
        time.sleep(1.0)
    wait = read_main_wait(samples[0]) if samples else None
    return {"trees": trees, "main_wait": wait}


def record(case: str) -> dict:
    act = None
    if case == "deadlock":
        proc = start_script(TRAIN_LOOP, "--epochs", "1", "--batches", "30", "--hang-at", "1:5")
        wait_for_line(proc, r"batch=4/", 60)
        time.sleep(1.0)
    elif case == "workers_stopped":
        proc = start_script(TRAIN_LOOP, "--epochs", "1", "--batches", "3000", "--batch-time", "0.02")
        wait_for_line(proc, r"batch=20/", 60)

        def act():
            for w in psutil.Process(proc.pid).children():
                w.send_signal(signal.SIGSTOP)

    elif case == "zombie":
        proc = start_script(STEADY, "--batches", "3000", "--batch-time", "0.02", "--mp-workers", "1")
        wait_for_line(proc, r"batch=20/", 30)

        def act():
            psutil.Process(proc.pid).children()[0].send_signal(signal.SIGKILL)

    elif case == "healthy":
        proc = start_script(TRAIN_LOOP, "--epochs", "2", "--batches", "80", "--batch-time", "0.05")
        wait_for_line(proc, r"batch=1/", 60)
    else:
        raise SystemExit(f"record_trees: unknown case {case!r}")
    try:
        return _record(proc, 13 if case == "deadlock" else 10, act)
    finally:
        kill_group(proc)


def main(argv: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for case in argv or ["deadlock", "workers_stopped", "zombie", "healthy"]:
        (OUT / f"{case}.json").write_text(json.dumps(record(case), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {OUT / case}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
