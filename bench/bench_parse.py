"""Throughput of the console parser and the line splitter (prints figures; asserts nothing).

Usage: .venv/bin/python bench/bench_parse.py [--seconds S]

Figures are best-of-N in process CPU time (time.process_time), so other processes on a
shared machine distort them less; the calibration line says how fast this core runs plain
Python right now (``sum(range(1000))`` takes about 7-10 us on an idle modern x86 core).
"""

from __future__ import annotations

import argparse
import time
import timeit
from pathlib import Path

from trainctl.core.lines import LineSplitter
from trainctl.core.parse import ConsoleParser
from trainctl.core.signatures import WarningMatcher

LOGS = Path(__file__).resolve().parent.parent / "tests" / "data" / "logs"


def ul84_lines(n: int) -> list[str]:
    bar = "━━━━━━━━━━──"
    return [
        f"{1 + i // 41163:9d}/50{'0G':>11}{1.2 + i % 7 / 10:11.4g}{0.9:11.4g}{1.05:11.4g}"
        f"{31:11d}{640:11d}: {i % 41163 * 100 // 41163}% {bar} {i % 41163 + 1}/41163 "
        f"{2.6:.1f}it/s 1:02:03<3:45:06"
        for i in range(n)
    ]


def ul83_lines(n: int) -> list[str]:
    return [
        f"{1 + i // 351:11}/400      29.9G     0.6966     0.3341      1.085         31        640:"
        f"  {i % 351 * 100 // 351:2d}%|██████    | {i % 351 + 1}/351 [04:18<00:00,  1.36it/s]"
        for i in range(n)
    ]


def tqdm_lines(n: int) -> list[str]:
    return [
        f"Epoch 3:  {i % 100:2d}%|████▌     | {i % 100}/100 [00:10<00:12,  4.40it/s, loss={0.123 + i % 5:.3g}]"
        for i in range(n)
    ]


def keyvalue_lines(n: int) -> list[str]:
    return [f"epoch={1 + i // 30} batch={i % 30 + 1}/30 loss={0.53:.4f} lr=0.001" for i in range(n)]


def bench_parser(name: str, lines: list[str], seconds: float) -> None:
    best = 0.0
    deadline = time.perf_counter() + seconds
    events = 0
    while time.perf_counter() < deadline:
        p = ConsoleParser()
        feed = p.feed
        t0 = time.process_time()
        for line in lines:
            events += len(feed(line, 0.0))
        dt = time.process_time() - t0
        best = max(best, len(lines) / dt)
    print(f"{name:28s} {best:12,.0f} lines/s  (best of repeated runs of {len(lines):,} lines)")


def bench_splitter(seconds: float) -> None:
    raw = (LOGS / "ultralytics84_cpu_long.log").read_bytes()
    data = raw * max(1, (8 << 20) // len(raw))  # ~8 MB
    for chunk in (65536, 4096):
        best = 0.0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            s = LineSplitter()
            t0 = time.process_time()
            n = 0
            for i in range(0, len(data), chunk):
                n += len(s.feed(data[i : i + chunk]))
            n += len(s.flush())
            dt = time.process_time() - t0
            best = max(best, len(data) / dt / 1e6)
        print(
            f"LineSplitter chunk={chunk:<6d}     {best:12.1f} MB/s   ({n:,} lines from {len(data) / 1e6:.1f} MB)"
        )


LONG_LINES = {  # hostile long lines (issue 14): each took time quadratic in its length
    "epoch + spaces": lambda n: "epoch" + " " * n + "x",
    "epoch + one long word": lambda n: "epoch 1 " + "a" * n,
    "epoch [ + spaces": lambda n: "epoch [" + " " * n + "x",
    "epoch 1 loss ...": lambda n: "epoch 1 loss " * (n // 13),
    "tqdm-like colons": lambda n: "a: 1%|x| 1/2 [" * (n // 14) + "]x",
    "Ultralytics + digits": lambda n: "1/2 0G x: 5% " + "1" * n,
    "epoch 1.0it/s ...": lambda n: "epoch " + "1.0it/s " * (n // 8),
}


def bench_long_lines() -> None:
    """Time per line (splitter + parser + warning matcher, as the agent runs them) against
    the line's length: the cut at MAX_LINE and linear regexes keep it flat past 4 KiB."""
    sizes = (1 << 10, 4 << 10, 16 << 10, 64 << 10)
    print("time per long line (split + parse + match), ms:")
    print(f"  {'line':24s}" + "".join(f"{n >> 10:>7d}K" for n in sizes))
    for name, make in LONG_LINES.items():
        row = []
        for n in sizes:
            data = make(n).encode() + b"\n"
            best = float("inf")
            for _ in range(5):
                s, p, w = LineSplitter(), ConsoleParser(), WarningMatcher()
                t0 = time.process_time()
                for line in s.feed(data):
                    p.feed(line, 0.0)
                    w.feed(line, 0.0)
                best = min(best, time.process_time() - t0)
            row.append(best * 1e3)
        print(f"  {name:24s}" + "".join(f"{ms:8.2f}" for ms in row))


def calibrate() -> None:
    timer = timeit.Timer("sum(range(1000))", timer=time.process_time)
    best = min(timer.repeat(number=2000, repeat=7)) / 2000
    print(f"calibration: sum(range(1000)) = {best * 1e6:.1f} us on this core")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    a = ap.parse_args()
    calibrate()
    n = 50_000
    bench_parser("Ultralytics 8.4 frames", ul84_lines(n), a.seconds)
    bench_parser("Ultralytics 8.3 tqdm lines", ul83_lines(n), a.seconds)
    bench_parser("generic tqdm lines", tqdm_lines(n), a.seconds)
    bench_parser("key=value lines", keyvalue_lines(n), a.seconds)
    bench_splitter(a.seconds)
    bench_long_lines()


if __name__ == "__main__":
    main()
