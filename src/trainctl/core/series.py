"""One loss as a client keeps it, in bounded memory, and LTTB to draw it (no Textual here).

A :class:`Series` keeps every point in its whole-run history, which is downsampled with LTTB
(largest triangle three buckets, :func:`lttb`) to :data:`WHOLE_KEEP` points whenever it
reaches twice that, keeping the points at restart and incident marks; the newest
:data:`RECENT_KEEP` points also stay at full resolution (the last hour, the last epoch).
:class:`~trainctl.core.runview.RunView` holds one per loss.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

WHOLE_KEEP = 2000  # points per loss over the whole run, after a downsampling
RECENT_KEEP = 4000  # newest points per loss at full resolution (over an hour at 1/s)
CHART_POINTS = 400  # points per loss series drawn on the chart


def lttb(xs: list[float], ys: list[float], n: int, keep: tuple[float, ...] | list[float] = ()) -> list[int]:
    """Indices of about ``n`` points of (xs, ys) that keep its shape (largest triangle three
    buckets; xs ascending): always the first and the last, and the first point at or after
    each x in ``keep`` (restart and incident marks)."""
    size = len(xs)
    if size <= n or n < 3:
        return list(range(size)) if size <= n else [0, size - 1]
    out = [0]
    every = (size - 2) / (n - 2)
    a = 0
    for i in range(n - 2):
        start, end = int(i * every) + 1, int((i + 1) * every) + 1
        nxt_start, nxt_end = end, min(int((i + 2) * every) + 1, size)
        if nxt_end <= nxt_start:
            nxt_start, nxt_end = size - 1, size
        span = nxt_end - nxt_start
        avg_x = sum(xs[nxt_start:nxt_end]) / span
        avg_y = sum(ys[nxt_start:nxt_end]) / span
        ax, ay = xs[a], ys[a]
        best, best_area = start, -1.0
        for j in range(start, min(end, size - 1)):
            area = abs((ax - avg_x) * (ys[j] - ay) - (ax - xs[j]) * (avg_y - ay))
            if area > best_area:
                best, best_area = j, area
        out.append(best)
        a = best
    out.append(size - 1)
    if keep:
        marks = {bisect.bisect_left(xs, x) for x in keep if xs[0] <= x <= xs[-1]}
        out = sorted(set(out) | {i for i in marks if i < size})
    return out


@dataclass
class Series:
    """One loss over the global batch index (finite values only): ``xs, ys, ts`` the whole
    run (downsampled past 2 × WHOLE_KEEP points), ``rxs, rys, rts`` the newest points."""

    xs: list[float] = field(default_factory=list)
    ys: list[float] = field(default_factory=list)
    ts: list[float] = field(default_factory=list)
    rxs: list[float] = field(default_factory=list)
    rys: list[float] = field(default_factory=list)
    rts: list[float] = field(default_factory=list)

    def add(self, x: float, y: float, t: float, marks: Callable[[], list[float]]) -> None:
        self.xs.append(x)
        self.ys.append(y)
        self.ts.append(t)
        if len(self.xs) >= 2 * WHOLE_KEEP:
            keep = lttb(self.xs, self.ys, WHOLE_KEEP, marks())
            self.xs = [self.xs[i] for i in keep]
            self.ys = [self.ys[i] for i in keep]
            self.ts = [self.ts[i] for i in keep]
        self.rxs.append(x)
        self.rys.append(y)
        self.rts.append(t)
        if len(self.rxs) >= RECENT_KEEP + RECENT_KEEP // 4:
            del self.rxs[:-RECENT_KEEP], self.rys[:-RECENT_KEEP], self.rts[:-RECENT_KEEP]

    def window(
        self, x_from: float | None = None, t_from: float | None = None
    ) -> tuple[list[float], list[float]]:
        """The points from ``x_from`` (or time ``t_from``) on: the whole-run history up to
        where the full-resolution points begin, then those."""
        if not self.rxs:
            xs, ys, ts = self.xs, self.ys, self.ts
        else:
            cut = bisect.bisect_left(self.xs, self.rxs[0])
            xs, ys, ts = self.xs[:cut] + self.rxs, self.ys[:cut] + self.rys, self.ts[:cut] + self.rts
        start = 0
        if x_from is not None:
            start = bisect.bisect_left(xs, x_from)
        if t_from is not None:
            start = max(start, next((i for i, t in enumerate(ts) if t >= t_from), len(ts)))
        return xs[start:], ys[start:]

    def sampled(
        self,
        points: int = CHART_POINTS,
        x_from: float | None = None,
        t_from: float | None = None,
        marks: tuple[float, ...] = (),
    ) -> tuple[list[float], list[float]]:
        """At most about ``points`` points (LTTB) of the window, first and last kept."""
        xs, ys = self.window(x_from, t_from)
        keep = lttb(xs, ys, points, marks)
        return [xs[i] for i in keep], [ys[i] for i in keep]
