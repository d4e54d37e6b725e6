"""What the dashboard's look at every run costs (the header's attention count, every 5 s):
`summarize` of a long run's journal read whole (as `trainctl ls` does, once) against the
kept fold (src/trainctl/store/listing.py JournalFold) that reads only the lines written since.

    .venv/bin/python bench/bench_runs_look.py [--days 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_long_run as long_run  # noqa: E402

from trainctl.core import events as E  # noqa: E402
from trainctl.hosts.local import summarize  # noqa: E402
from trainctl.store.journal import Journal  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=1.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        long_run.build(run_dir, args.days, ROOT / "tests" / "data" / "journals" / "handmade_run.jsonl")
        long_run.write_spec(run_dir, "bench")
        size = (run_dir / "events.jsonl").stat().st_size
        t = time.perf_counter()
        whole = summarize(run_dir, with_slurm=False)
        whole_s = time.perf_counter() - t
        folds: dict = {}
        summarize(run_dir, with_slurm=False, folds=folds)
        journal = Journal(run_dir / "events.jsonl")
        looks = []
        for i in range(20):  # 5 s of a live run between looks: ~5 progress lines
            for j in range(5):
                journal.append(E.Progress(2e9 + i * 5 + j, 1, 50, j, 100, {"loss": 1.0}))
            t = time.perf_counter()
            kept = summarize(run_dir, with_slurm=False, folds=folds)
            looks.append(time.perf_counter() - t)
        journal.close()
        assert kept["progress"]["batch"] == 4 and whole["state"] == kept["state"]
        print(
            f"journal {size / 1e6:.1f} MB ({args.days:g} days): read whole {whole_s * 1e3:.0f} ms; "
            f"kept fold, 5 new lines {sorted(looks)[len(looks) // 2] * 1e3:.2f} ms (median of 20)"
        )


if __name__ == "__main__":
    main()
