"""Key-to-screen latency of the dashboard while the trainer prints 10,000 lines/s.

A FakeAgent (tests/tui/tui_fakes.py) replays the journal fixture, then a feeder sends
Log events at ``--lines`` lines/s (in 5 ms chunks), Progress events at ``--progress``/s and
a Tick every second, all through the real bridge.  Meanwhile ``l`` (toggle the log tail)
is pressed ``--presses`` times; each latency is the time from posting the key until the
log panel's region on screen has changed (shown / hidden) — the layout the next frame
draws.  Prints the median and other figures.  Goal: median < 100 ms.

    .venv/bin/python bench/bench_tui.py [--lines 10000] [--presses 30]
"""
from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "tui"))

from textual import events  # noqa: E402
from tui_fakes import FakeAgent, replay_journal  # noqa: E402

from trainctl.engine import events as ev  # noqa: E402
from trainctl.tui.app import TrainctlApp  # noqa: E402
from trainctl.tui.widgets.log_tail import LogTail  # noqa: E402

LINE = ("      3/50      4.21G      1.301      1.482      1.094         41        640: "
        " 37% ━━━━──────── {n}/41163 2.1it/s 1:02:11<1:45:00")


async def feed(agent: FakeAgent, lines_per_s: int, progress_per_s: int, stop: asyncio.Event,
               counts: dict[str, int]) -> None:
    """Emit Log/Progress/Tick at the given rates until ``stop`` is set."""
    start = time.monotonic()
    last_tick = start
    n = 0
    batch_no = 0
    ts0 = agent.journal[-1].ts
    while not stop.is_set():
        await asyncio.sleep(0.005)
        now = time.monotonic()
        due = int((now - start) * lines_per_s) - counts["lines"]
        if due > 0:
            agent.emit(ev.Log(ts0 + now - start,
                              lines=tuple(LINE.format(n=n + i) for i in range(due))))
            n += due
            counts["lines"] += due
        due_p = int((now - start) * progress_per_s) - counts["progress"]
        for _ in range(max(0, due_p)):
            batch_no += 1
            agent.append(ev.Progress(ts0 + now - start, epoch=3, epochs=50,
                                     batch=batch_no % 41163 + 1, batches=41163,
                                     losses={"box_loss": 1.3, "cls_loss": 1.5, "dfl_loss": 1.1},
                                     rate=2.1))
            counts["progress"] += 1
        if now - last_tick >= 1.0:
            last_tick = now
            agent.emit(ev.Tick(ts0 + now - start, phase="train", idle_s=0.1, threshold_s=60.0))


async def measure(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench_tui_"))
    try:
        presets = {n: Path(shutil.copy(ROOT / "presets" / f"{n}.toml", tmp / f"{n}.toml"))
                   for n in ("A", "B")}
        journal = replay_journal()
        agent = FakeAgent(journal, {"job": "bench", "host": "here", "state": "RUNNING",
                                    "preset": "B", "fallback": "B", "run_dir": str(tmp)}, presets)
        app = TrainctlApp(agent.client)
        latencies: list[float] = []
        counts = {"lines": 0, "progress": 0}
        async with app.run_test(size=(160, 48)) as pilot:
            while app.dashboard.model.last_seq < journal[-1].seq:
                await pilot.pause(0.01)
            stop = asyncio.Event()
            feeder = asyncio.create_task(feed(agent, args.lines, args.progress, stop, counts))
            log = app.dashboard.query_one(LogTail)
            await asyncio.sleep(1.0)                   # let the flood settle in
            started = time.monotonic()
            for _ in range(args.presses):
                want_shown = not app.dashboard.show_log
                t0 = time.perf_counter()
                app.post_message(events.Key("l", "l"))
                while (log.region.height > 0) != want_shown:
                    await asyncio.sleep(0.001)
                latencies.append((time.perf_counter() - t0) * 1000)
                await asyncio.sleep(args.gap)
            elapsed = time.monotonic() - started
            stop.set()
            await feeder
            shown_lines = len(app.dashboard.model.log)
            points = app.dashboard.model.chart_points()
        lines_per_s = counts["lines"] / (elapsed + 1.0)
        print(f"trainer output fed: {counts['lines']:,} lines ({lines_per_s:,.0f} lines/s), "
              f"{counts['progress']:,} progress events; log tail holds {shown_lines} lines; "
              f"{points:,} chart points")
        print(f"key 'l' -> screen, {len(latencies)} presses: median {statistics.median(latencies):.1f} ms, "
              f"p90 {sorted(latencies)[int(0.9 * len(latencies)) - 1]:.1f} ms, "
              f"min {min(latencies):.1f} ms, max {max(latencies):.1f} ms "
              f"(goal: median < 100 ms)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10_000, help="trainer lines per second")
    parser.add_argument("--progress", type=int, default=50, help="progress events per second")
    parser.add_argument("--presses", type=int, default=30)
    parser.add_argument("--gap", type=float, default=0.2, help="seconds between presses")
    asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    main()
