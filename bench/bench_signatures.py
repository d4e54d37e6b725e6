"""Throughput of the warning matcher on healthy lines (goal: >= 100k lines/s).

Usage: .venv/bin/python bench/bench_signatures.py [SECONDS] [--compare OTHER.toml]

Feeds tests/data/healthy_lines.txt, and a progress-heavy mix (what a real run prints:
mostly Ultralytics batch frames), through WarningMatcher.feed, with and without the
prefilter, and a stream of warning lines for the slow path.  Prints lines/s.

--compare OTHER.toml measures another catalog file (e.g. an older signatures.toml from
``git show REV:engine/signatures.toml``) in the same run, alternating with this one (best
of 3 each), and prints both columns side by side, so a wider catalog's cost is read on the
same core and load.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from trainctl.core.signatures import Catalog, WarningMatcher

ROOT = Path(__file__).resolve().parents[1]


def healthy_lines() -> list[str]:
    text = (ROOT / "tests/data/healthy_lines.txt").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def progress_mix(healthy: list[str]) -> list[str]:
    """~90 % batch frames like a real run, the rest other healthy lines."""
    frames = [
        f"       {e}/50      3.21G      1.234     0.8{b % 10}21      1.1{b % 7}3         42        640: "
        f"{b * 100 // 41163}% ━━━━━━────── {b}/41163 2.4it/s 1:02:03<3:04:05"
        for e in range(1, 4)
        for b in range(1, 301)
    ]
    return frames + healthy[:100]


def rate(catalog: Catalog, lines: list[str], seconds: float, source: str = "trainer") -> float:
    """Lines per CPU second, the best pass of those that fit in ``seconds`` (process time,
    best pass: other load on a shared box slows some passes, not the figure)."""
    matcher = WarningMatcher(catalog)
    feed = matcher.feed
    best = 0.0
    start = time.process_time()
    while time.process_time() - start < seconds:
        t0 = time.process_time()
        for line in lines:
            feed(line, 0.0, source)
        best = max(best, len(lines) / max(time.process_time() - t0, 1e-9))
    return best


def unfiltered(catalog: Catalog) -> Catalog:
    """The same catalog trying every signature on every line (no prefilter)."""
    copy = Catalog(catalog.signatures, catalog.codes, catalog.path)
    everything = frozenset(range(len(copy._patterns)))
    copy._prefilter.candidates = lambda line: set(everything)
    return copy


def describe(name: str, catalog: Catalog, healthy: list[str]) -> None:
    pf = catalog._prefilter
    hits = sum(bool(pf.candidates(line)) for line in healthy)
    print(
        f"{name}: {catalog.path}: {len(catalog)} signatures, "
        f"{sum(len(s.patterns) for s in catalog)} patterns; prefilter: {len(pf.words)} trigger words, "
        f"{len(pf.substrings)} substrings, {len(pf.always)} unfiltered patterns; "
        f"healthy lines on the slow path: {hits}/{len(healthy)}"
    )


def main() -> None:
    args = sys.argv[1:]
    other = None
    if "--compare" in args:
        i = args.index("--compare")
        other = Catalog.load(args[i + 1])
        del args[i : i + 2]
    seconds = float(args[0]) if args else 2.0
    catalogs = {"this": Catalog.load()}
    if other is not None:
        catalogs["other"] = other
    healthy = healthy_lines()
    mix = progress_mix(healthy)
    # the same warning lines for every catalog: this catalog's examples
    bad = [ex for sig in catalogs["this"] for ex in sig.examples]
    for name, cat in catalogs.items():
        describe(name, cat, healthy)
    rows = [
        (f"healthy corpus ({len(healthy)} lines)", lambda c: rate(c, healthy, seconds)),
        (f"progress-heavy mix ({len(mix)} lines)", lambda c: rate(c, mix, seconds)),
        ("same mix, no prefilter", lambda c: rate(unfiltered(c), mix, seconds)),
        (f"warning lines ({len(bad)}, source=any)", lambda c: rate(c, bad, seconds, "any")),
    ]
    print(
        f"{'lines/s':38s}"
        + "".join(f"{name:>14s}" for name in catalogs)
        + ("     change" if other is not None else "")
    )
    rounds = 3 if other is not None else 1
    for label, measure in rows:
        # alternate the catalogs, best of `rounds` each: load on a shared box shifts both alike
        best = {name: 0.0 for name in catalogs}
        for _ in range(rounds):
            for name, cat in catalogs.items():
                best[name] = max(best[name], measure(cat))
        figures = list(best.values())
        change = f"  {figures[0] / figures[1] - 1:+8.1%}" if other is not None else ""
        print(f"{label:38s}" + "".join(f"{f:>14,.0f}" for f in figures) + change)


if __name__ == "__main__":
    main()
