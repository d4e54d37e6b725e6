"""What the preset history costs (prints figures; asserts nothing).

Usage: .venv/bin/python bench/bench_preset_history.py [--runs 1000] [--events 100000]

* one write of a run's file (three presets), as the agent's feed does it at most every 30 s
  and on each incident: median of 200, on the event loop;
* the feed's work per journaled event (PresetUsage.on_event): a replayed run of --events
  progress events with a hang every 5,000 batches, per event;
* a read merging --runs run files (`trainctl presets stats`, and each agent once at start).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from trainctl.core import events as E
from trainctl.core.preset_usage import PresetUsage
from trainctl.store.preset_history import PresetHistory, Record, RecordKey


def _records(i: int) -> list[Record]:
    return [
        Record(
            RecordKey("yolo", "box (H100)", p, f"c{p}"),
            1.5 + i % 3,
            9000,
            {"deadlock": i % 2},
            {"detection": 30.0},
            i % 2,
        )
        for p in ("A", "B", "A2")
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--events", type=int, default=100_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        h = PresetHistory(Path(tmp) / "hist")
        writes = []
        for i in range(200):
            t0 = time.perf_counter()
            h.write_run("this-run", _records(i), float(i))
            writes.append(time.perf_counter() - t0)
        print(
            f"write one run's file (3 presets): median {statistics.median(writes) * 1e3:.2f} ms, max {max(writes) * 1e3:.2f} ms"
        )

        usage = PresetUsage(lambda p: "c")
        evs: list[E.Event] = [E.Start(0.0, 1, 1, "A")]
        t, b, attempt = 0.0, 0, 1
        while len(evs) < args.events:
            b += 1
            t += 0.1
            evs.append(E.Progress(t, None, None, b, None))
            if (len(evs) + 1) % 5000 == 0:
                attempt += 1
                evs += [E.Stall(t + 10, "train", 10.0, "deadlock"), E.Exit(t + 11, -15, "SIGTERM")]
                evs += [
                    E.Restart(t + 11, attempt, "the trainer stalled", "A", None),
                    E.Start(t + 12, attempt, 1, "A"),
                ]
                t += 20
                b -= 50
        t0 = time.perf_counter()
        for ev in evs:
            usage.on_event(ev)
        per = (time.perf_counter() - t0) / len(evs)
        tally = usage.tallies(t)[("A", "c")]
        print(
            f"PresetUsage.on_event: {per * 1e6:.2f} µs per event over {len(evs):,} ({sum(tally.incidents.values())} incidents)"
        )

        for i in range(args.runs):
            h.write_run(f"run-{i}", _records(i), float(i))
        t0 = time.perf_counter()
        records, problems = h.read("yolo")
        took = time.perf_counter() - t0
        print(
            f"read and merge {args.runs} run files: {took * 1e3:.0f} ms ({len(records)} records, {len(problems)} problems)"
        )


if __name__ == "__main__":
    main()
