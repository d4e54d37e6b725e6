"""`trainctl report` on a ten-day journal (issue 32: ≤ 3 s).

    .venv/bin/python bench/bench_report.py [--days 10]

Builds the synthetic journal of bench/bench_long_run.py (one progress event a second:
864,000 for ten days, a projection every 30 s, a warning an hour, a stall and a restart a
day), then times, each in a fresh process (`python -m trainctl report RUN_DIR`, wall clock):

* the report with the run's snapshot.json (what a run directory holds: the agent writes
  it), the median of 3;
* the report with no snapshot (an older run, a snapshot deleted): the whole journal folded;
* the goodput's share of a fold: the same journal folded with and without it (in process).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import bench_long_run as long_run  # noqa: E402


def report_s(run_dir: Path, out: Path) -> float:
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "trainctl", "report", str(run_dir), "-o", str(out)],
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=10.0)
    args = ap.parse_args()
    from trainctl.core.goodput import Goodput
    from trainctl.store.journal import read_events
    from trainctl.store.snapshot import load_view

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        n, built_s, _ = long_run.build(run_dir, args.days, long_run.DEMO)
        long_run.write_spec(run_dir, "bench")
        size = (run_dir / "events.jsonl").stat().st_size
        print(f"journal: {args.days:g} days, {n:,} events, {size / 2**20:.1f} MiB (built in {built_s:.0f} s)")
        t = time.perf_counter()
        load_view(run_dir, write=True)  # the snapshot the agent would have written
        print(f"indexing (snapshot.json written once): {time.perf_counter() - t:.2f} s")
        out = Path(tmp) / "report.html"
        runs = [report_s(run_dir, out) for _ in range(3)]
        print(
            f"report with the snapshot: {statistics.median(runs):.2f} s (median of 3; "
            f"{', '.join(f'{r:.2f}' for r in runs)}), {out.stat().st_size / 1024:.0f} KiB of HTML"
        )
        (run_dir / "snapshot.json").unlink()
        print(f"report without a snapshot (the whole journal folded): {report_s(run_dir, out):.2f} s")
        events = list(read_events(run_dir / "events.jsonl"))
        g = Goodput()
        t = time.perf_counter()
        for e in events:
            g.apply(e)
        fold_s = time.perf_counter() - t
        print(
            f"goodput fold alone: {fold_s:.2f} s for {len(events):,} events "
            f"({fold_s / len(events) * 1e6:.2f} µs an event); ratio {g.totals()['ratio']}"
        )


if __name__ == "__main__":
    main()
