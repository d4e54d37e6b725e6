"""What the preset history costs (prints figures; asserts nothing).

Usage: .venv/bin/python bench/bench_preset_history.py [--runs 1000] [--events 100000]

* one write of a run's file (three presets), as the agent's feed does it at most every 30 s
  and on each incident: median of 200, on the event loop;
* the feed's work per journaled event (PresetUsage.on_event): a replayed run of --events
  progress events with a hang every 5,000 batches, per event;
* a read merging --runs run files (`trainctl presets stats`, and each agent once at start).

The table goes through bench/doc_tables.py (``--docs``: block ``preset-history``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from trainctl.core import events as E
from trainctl.core.preset_usage import PresetUsage
from trainctl.store.preset_history import PresetHistory, Record, RecordKey

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_tables import Recorder, add_docs_flag

DOC_TABLES = {"preset-history": ("what", "figure")}


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
    add_docs_flag(ap)
    args = ap.parse_args()
    rec = Recorder(DOC_TABLES, args.docs)
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        h = PresetHistory(Path(tmp) / "hist")
        writes = []
        for i in range(200):
            t0 = time.perf_counter()
            h.write_run("this-run", _records(i), float(i))
            writes.append(time.perf_counter() - t0)
        rows.append(
            [
                "one write of a run's history file (3 presets), 200 writes",
                f"median {statistics.median(writes) * 1e3:.2f} ms, max {max(writes) * 1e3:.2f} ms",
            ]
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
        rows.append(
            [
                f"the feed's accounting per journaled event (`PresetUsage.on_event`, {len(evs):,} events, "
                f"{sum(tally.incidents.values())} incidents)",
                f"{per * 1e6:.2f} µs",
            ]
        )

        for i in range(args.runs):
            h.write_run(f"run-{i}", _records(i), float(i))
        t0 = time.perf_counter()
        records, problems = h.read("yolo")
        took = time.perf_counter() - t0
        rows.append(
            [
                f"reading and merging {args.runs:,} run files (`trainctl presets stats`; each agent once at start)",
                f"{took * 1e3:.0f} ms ({len(records)} records, {len(problems)} problems)",
            ]
        )
    rec.publish("preset-history", rows)


if __name__ == "__main__":
    main()
