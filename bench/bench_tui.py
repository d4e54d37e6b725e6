"""Key-to-screen latency of the dashboard while the trainer prints 10,000 lines/s.

Two set-ups, both by default:

* real: a real agent (`python -m trainctl run --headless --no-tmux`) supervises a real
  trainer process that prints Ultralytics 8.4 progress frames at ``--lines`` lines/s (the
  generator of bench/bench_overhead.py), and the dashboard is attached to it through the
  real local client (its Unix socket), as `trainctl attach` does.  The TUI gets what the
  agent makes of the flood: batched log lines and progress events.
* fake: a FakeAgent (tests/tui/tui_fakes.py) replays the journal fixture, then a feeder
  sends Log events at ``--lines`` lines/s (in 5 ms chunks), Progress events at
  ``--progress``/s and a Tick every second, all through the real bridge: the dashboard
  alone, with more progress events than an agent sends.

Meanwhile ``l`` (toggle the log tail) is pressed ``--presses`` times; each latency is the
time from posting the key until the log panel's region on screen has changed (shown /
hidden): the layout the next frame draws.  Prints the median and other figures.
Goal: median < 100 ms.  On this 2-core machine the trainer, the agent and the TUI share
two cores in the real set-up.

    .venv/bin/python bench/bench_tui.py [--lines 10000] [--presses 30] [--only real|fake]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "tui"))

from textual import events
from tui_fakes import FakeAgent, replay_journal

from trainctl.client.connection import local_client
from trainctl.core import events as ev
from trainctl.store.paths import RunFiles
from trainctl.tui.app import TrainctlApp
from trainctl.tui.widgets.log_tail import LogTail

LINE = (
    "      3/50      4.21G      1.301      1.482      1.094         41        640: "
    " 37% ━━━━──────── {n}/41163 2.1it/s 1:02:11<1:45:00"
)


async def feed(
    agent: FakeAgent, lines_per_s: int, progress_per_s: int, stop: asyncio.Event, counts: dict[str, int]
) -> None:
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
            agent.emit(ev.Log(ts0 + now - start, lines=tuple(LINE.format(n=n + i) for i in range(due))))
            n += due
            counts["lines"] += due
        due_p = int((now - start) * progress_per_s) - counts["progress"]
        for _ in range(max(0, due_p)):
            batch_no += 1
            agent.append(
                ev.Progress(
                    ts0 + now - start,
                    epoch=3,
                    epochs=50,
                    batch=batch_no % 41163 + 1,
                    batches=41163,
                    losses={"box_loss": 1.3, "cls_loss": 1.5, "dfl_loss": 1.1},
                    rate=2.1,
                )
            )
            counts["progress"] += 1
        if now - last_tick >= 1.0:
            last_tick = now
            agent.emit(ev.Tick(ts0 + now - start, phase="train", idle_s=0.1, threshold_s=60.0))


async def press_l(app: TrainctlApp, args: argparse.Namespace) -> tuple[list[float], float]:
    """Press ``l`` ``--presses`` times; the latencies (ms) and the seconds it all took."""
    log = app.dashboard.query_one(LogTail)
    latencies: list[float] = []
    started = time.monotonic()
    for _ in range(args.presses):
        want_shown = not app.dashboard.show_log
        t0 = time.perf_counter()
        app.post_message(events.Key("l", "l"))
        while (log.region.height > 0) != want_shown:
            await asyncio.sleep(0.001)
        latencies.append((time.perf_counter() - t0) * 1000)
        await asyncio.sleep(args.gap)
    return latencies, time.monotonic() - started


def report(latencies: list[float]) -> None:
    print(
        f"key 'l' -> screen, {len(latencies)} presses: median {statistics.median(latencies):.1f} ms, "
        f"p90 {sorted(latencies)[int(0.9 * len(latencies)) - 1]:.1f} ms, "
        f"min {min(latencies):.1f} ms, max {max(latencies):.1f} ms "
        f"(goal: median < 100 ms)"
    )


async def measure_real(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench_tui_real_"))
    run_dir = tmp / "run"
    seconds = 6.0 + args.presses * (args.gap + 0.1)
    gen = [
        sys.executable,
        str(ROOT / "bench" / "bench_overhead.py"),
        "_gen",
        "ul84",
        str(args.lines),
        str(seconds),
        str(tmp / "gen.json"),
    ]
    agent = start_agent(run_dir, gen, tmp / "agent.out")
    try:
        deadline = time.monotonic() + 30
        while not RunFiles(run_dir).sock.exists():
            if agent.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the agent did not start; see {tmp / 'agent.out'}")
            await asyncio.sleep(0.05)
        app = TrainctlApp(lambda: local_client(run_dir))
        async with app.run_test(size=(160, 48)) as pilot:
            while app.dashboard.model.progress is None:
                if agent.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"no progress reached the dashboard; see {tmp / 'agent.out'}")
                await pilot.pause(0.05)
            await asyncio.sleep(1.0)  # let the flood settle in
            cpu0 = _cpu(agent.pid)
            latencies, elapsed = await press_l(app, args)
            cpu1 = _cpu(agent.pid)
            log_lines = len(app.dashboard.model.log)
            points = app.dashboard.model.chart_points()
            still_running = agent.poll() is None
        if not still_running:
            print("warning: the trainer ended before the presses did; raise --gap or lower --presses")
        agent.wait(seconds + 30)
        st = json.loads((tmp / "gen.json").read_text())
        written = st["n"] / (st["t1"] - st["t0"])
        progress = sum(
            '"type":"progress"' in line for line in (run_dir / "events.jsonl").read_text().splitlines()
        )
        print(
            f"real agent + trainer: the trainer wrote {st['n']:,} lines ({written:,.0f} lines/s asked "
            f"{args.lines:,}); the agent journaled {progress:,} progress events; its CPU while the "
            f"keys were pressed: {100 * (cpu1 - cpu0) / elapsed:.0f} % of a core; log tail holds "
            f"{log_lines} lines; {points:,} chart points"
        )
        report(latencies)
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGINT)
            try:
                agent.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(agent.pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


def start_agent(run_dir: Path, trainer: list[str], out: Path) -> subprocess.Popen[bytes]:
    with open(out, "wb") as fh:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainctl",
                "run",
                "--headless",
                "--no-tmux",
                "--no-auto-recover",
                "--run-dir",
                str(run_dir),
                "--name",
                "bench-tui",
                "--",
                *trainer,
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


async def measure_fake(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench_tui_"))
    try:
        presets = {
            n: Path(shutil.copy(ROOT / "src" / "trainctl" / "presets" / f"{n}.toml", tmp / f"{n}.toml"))
            for n in ("A", "B")
        }
        journal = replay_journal()
        agent = FakeAgent(
            journal,
            {
                "job": "bench",
                "host": "here",
                "state": "RUNNING",
                "preset": "B",
                "fallback": "B",
                "run_dir": str(tmp),
            },
            presets,
        )
        app = TrainctlApp(agent.client)
        latencies: list[float] = []
        counts = {"lines": 0, "progress": 0}
        async with app.run_test(size=(160, 48)) as pilot:
            while app.dashboard.model.last_seq < journal[-1].seq:
                await pilot.pause(0.01)
            stop = asyncio.Event()
            feeder = asyncio.create_task(feed(agent, args.lines, args.progress, stop, counts))
            await asyncio.sleep(1.0)  # let the flood settle in
            latencies, elapsed = await press_l(app, args)
            stop.set()
            await feeder
            shown_lines = len(app.dashboard.model.log)
            points = app.dashboard.model.chart_points()
        lines_per_s = counts["lines"] / (elapsed + 1.0)
        print(
            f"fake agent: output fed {counts['lines']:,} lines ({lines_per_s:,.0f} lines/s), "
            f"{counts['progress']:,} progress events; log tail holds {shown_lines} lines; "
            f"{points:,} chart points"
        )
        report(latencies)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10_000, help="trainer lines per second")
    parser.add_argument("--progress", type=int, default=50, help="progress events per second")
    parser.add_argument("--presses", type=int, default=30)
    parser.add_argument("--gap", type=float, default=0.2, help="seconds between presses")
    parser.add_argument("--only", choices=("real", "fake"), help="one set-up only")
    args = parser.parse_args()
    if args.only != "fake":
        asyncio.run(measure_real(args))
    if args.only != "real":
        asyncio.run(measure_fake(args))


if __name__ == "__main__":
    main()
