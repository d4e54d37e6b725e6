"""How good is the ETA?  Replays each recorded journal in tests/data/runs/ through the
Projector and compares the ETA made at 20/40/60/80 % of the work with the actual end
(the `finished` phase, else the final exit).  Goal: within 10 % at 20 % of the work.

    .venv/bin/python bench/bench_projection.py [JOURNAL.jsonl ...]

Errors are given two ways: of the run's whole duration (start -> end) and of the time
that was still left when the ETA was made.  `naive` is the whole-attempt mean rate with no
epoch overhead, for comparison.
"""

from __future__ import annotations

import sys
from pathlib import Path

from trainctl.core import events as E
from trainctl.core.projection import Projector
from trainctl.core.projection_text import humanize_duration
from trainctl.store.journal import read_events

RUNS = Path(__file__).resolve().parent.parent / "tests" / "data" / "runs"
MARKS = (0.2, 0.4, 0.6, 0.8)
GOAL_PCT = 10.0


def actual_end(events: list[E.Event]) -> float | None:
    for ev in events:
        if isinstance(ev, E.Phase) and ev.phase == "finished":
            return ev.ts
    exits = [ev for ev in events if isinstance(ev, E.Exit)]
    return exits[-1].ts if exits and exits[-1].returncode == 0 else None


def replay(path: Path) -> bool:
    events = list(read_events(path))
    end = actual_end(events)
    starts = [ev for ev in events if isinstance(ev, E.Start)]
    if end is None or not starts:
        print(f"{path.name}: no finished run in this journal")
        return False
    t0 = starts[0].ts
    proj = Projector(preset=starts[0].preset)
    marks = list(MARKS)
    first: tuple[float, int] | None = None  # the current attempt's first progress (naive)
    rows: list[tuple] = []
    first_err: float | None = None
    for ev in events:
        proj.on_event(ev)
        if isinstance(ev, E.Start):
            first = None
        if not isinstance(ev, E.Progress) or not (ev.epochs and ev.batches and ev.epoch and ev.batch):
            continue
        g, total = (ev.epoch - 1) * ev.batches + ev.batch, ev.epochs * ev.batches
        if first is None:
            first = (ev.ts, g)
        if not marks or g < marks[0] * total:
            continue
        while marks and g >= marks[0] * total:
            mark = marks.pop(0)
        p = proj.project(ev.ts)
        naive = None
        if ev.ts > first[0] and g > first[1]:
            naive = ev.ts + (total - g) * (ev.ts - first[0]) / (g - first[1])
        err_total = (p.eta - end) / (end - t0) * 100 if p.eta else None
        err_left = (p.eta - end) / (end - ev.ts) * 100 if p.eta else None
        naive_err = (naive - end) / (end - t0) * 100 if naive else None
        rows.append((mark, g / total, ev.ts - t0, p, err_total, err_left, naive_err))
        if mark == MARKS[0]:
            first_err = err_total
    final = proj.project(end)
    lost = final.lost_s if final is not None and final.lost_s is not None else 0.0
    print(
        f"{path.name}: {total} batches, actual duration {humanize_duration(end - t0)} "
        f"({end - t0:.1f} s), attempts {len(starts)}, lost to stalls {lost:.1f} s"
    )
    print("   at work   t(s)   rate it/s  predicted(s)  err of run  err of left  naive err")
    for mark, frac, t, p, et, el, ne in rows:
        pred = f"{p.eta - t0:10.1f}" if p.eta else "         ?"
        print(
            f"  {mark:4.0%} ({frac:4.0%}) {t:6.1f}  {p.rate or 0:9.2f}  {pred}   "
            f"{_pct(et)}     {_pct(el)}     {_pct(ne)}"
        )
    ok = first_err is not None and abs(first_err) <= GOAL_PCT
    if lost and rows and rows[0][3].eta:
        err_net = (rows[0][3].eta - (end - lost)) / (end - lost - t0) * 100
        print(
            f"  the 20 % ETA against the end less the time lost to stalls: "
            f"{_pct(err_net)} (a hang is not foreseeable at 20 %)"
        )
        ok = ok or abs(err_net) <= GOAL_PCT
    return ok


def _pct(v: float | None) -> str:
    return "     ?" if v is None else f"{v:+6.1f}%"


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted(RUNS.glob("*.jsonl"))
    results = [replay(p) for p in paths]
    print(
        f"goal: |error of run| <= {GOAL_PCT:.0f} % at 20 % of the work (less the time lost "
        f"to stalls, which no ETA foresees): {sum(results)}/{len(results)} journals"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
