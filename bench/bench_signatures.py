"""Throughput of the warning matcher on healthy lines (goal: >= 100k lines/s).

Usage: .venv/bin/python bench/bench_signatures.py [SECONDS]

Feeds tests/data/healthy_lines.txt, and a progress-heavy mix (what a real run prints:
mostly Ultralytics batch frames), through WarningMatcher.feed, with and without the
prefilter, and a stream of warning lines for the slow path.  Prints lines/s.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from trainctl.engine.signatures import Catalog, WarningMatcher

ROOT = Path(__file__).resolve().parents[1]


def healthy_lines() -> list[str]:
    text = (ROOT / "tests/data/healthy_lines.txt").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def progress_mix(healthy: list[str]) -> list[str]:
    """~90 % batch frames like a real run, the rest other healthy lines."""
    frames = [f"       {e}/50      3.21G      1.234     0.8{b % 10}21      1.1{b % 7}3         42        640: "
              f"{b * 100 // 41163}% ━━━━━━────── {b}/41163 2.4it/s 1:02:03<3:04:05"
              for e in range(1, 4) for b in range(1, 301)]
    return frames + healthy[:100]


def rate(catalog: Catalog, lines: list[str], seconds: float, source: str = "trainer") -> float:
    """Lines per CPU second (process time, so other load on a shared box does not count)."""
    matcher = WarningMatcher(catalog)
    n = 0
    t0 = time.process_time()
    while (elapsed := time.process_time() - t0) < seconds:
        for line in lines:
            matcher.feed(line, 0.0, source)
        n += len(lines)
    return n / elapsed


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    catalog = Catalog.load()
    unfiltered = Catalog(catalog.signatures, catalog.codes, catalog.path)
    everything = frozenset(range(len(catalog)))
    unfiltered._prefilter.candidates = lambda line: set(everything)  # no prefilter: try all
    healthy = healthy_lines()
    mix = progress_mix(healthy)
    bad = [ex for sig in catalog for ex in sig.examples]
    hits = sum(bool(catalog._prefilter.candidates(line)) for line in healthy)
    pf = catalog._prefilter
    print(f"catalog: {len(catalog)} signatures; prefilter: {len(pf.words)} trigger words, "
          f"{len(pf.substrings)} substrings, {len(pf.always)} unfiltered signatures")
    print(f"healthy lines passing the prefilter (slow path): {hits}/{len(healthy)}")
    print(f"healthy corpus ({len(healthy)} lines):      {rate(catalog, healthy, seconds):>10,.0f} lines/s")
    print(f"progress-heavy mix ({len(mix)} lines):    {rate(catalog, mix, seconds):>10,.0f} lines/s")
    print(f"same mix, no prefilter:             {rate(unfiltered, mix, seconds):>10,.0f} lines/s")
    print(f"warning lines ({len(bad)}, source=any):   {rate(catalog, bad, seconds, 'any'):>10,.0f} lines/s")


if __name__ == "__main__":
    main()
