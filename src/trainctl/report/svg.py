"""Inline SVG charts for the report: lines over time, marks on the same axis, a stacked bar.

Every text in an SVG goes through :func:`esc` (the callers' texts came from a journal)."""

from __future__ import annotations

import html
import math
import time

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
MARK_COLORS = {"stall": "#d62728", "exit": "#ff7f0e", "restart": "#7f7f7f", "checkpoint": "#2ca02c"}
WIDTH, HEIGHT = 960, 240
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 12, 28


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def clock(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = abs(s)
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


PLOT_MAX = 1e100
"""The largest magnitude drawn: beyond it (±1e308, a diverged loss) a value is off the chart,
as nan and inf are, so no span or tick of the axis overflows."""


def _plottable(v: float) -> bool:
    return math.isfinite(v) and abs(v) <= PLOT_MAX


def _num(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def line_chart(
    lines: dict[str, tuple[list[float], list[float]]],
    t0: float,
    t1: float,
    marks: list[tuple[float, str, str]] = (),  # type: ignore[assignment]
    title: str = "",
    hline: tuple[float, str] | None = None,
) -> str:
    """An SVG of ``lines`` (name -> (times, values)) over [t0, t1] (the x axis in hours from
    t0), the ``marks`` (time, kind, text) as vertical lines with their text as a tooltip, and
    ``hline`` (value, label) as a dashed horizontal line."""
    values = [y for _, ys in lines.values() for y in ys if _plottable(y)]
    if hline is not None and _plottable(hline[0]):
        values.append(hline[0])
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    pad = (hi - lo) * 0.05
    lo, hi = lo - pad, hi + pad
    span = max(t1 - t0, 1e-9)
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(t: float) -> float:
        return LEFT + (t - t0) / span * w

    def py(v: float) -> float:
        return TOP + (hi - v) / (hi - lo) * h

    out = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{esc(title)}">',
        f'<rect x="{LEFT}" y="{TOP}" width="{w}" height="{h}" fill="#fff" stroke="#ccc"/>',
    ]
    for v in _ticks(lo, hi):
        y = py(v)
        out.append(f'<line x1="{LEFT}" x2="{LEFT + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{esc(_num(v))}</text>')
    hours = span / 3600
    unit, div = ("h", 3600.0) if hours >= 2 else ("min", 60.0)
    for v in _ticks(0, span / div):
        x = px(t0 + v * div)
        out.append(f'<text x="{x:.1f}" y="{HEIGHT - 8}" text-anchor="middle">{esc(_num(v))} {unit}</text>')
    for t, kind, text in marks:
        if t0 <= t <= t1:
            x = px(t)
            color = MARK_COLORS.get(kind, "#7f7f7f")
            out.append(
                f'<line class="mark" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + h}" stroke="{color}" '
                f'stroke-dasharray="3,2"><title>{esc(clock(t))} {esc(kind)}: {esc(text)}</title></line>'
            )
    if hline is not None and _plottable(hline[0]):
        y = py(hline[0])
        out.append(
            f'<line x1="{LEFT}" x2="{LEFT + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#000" '
            f'stroke-dasharray="6,3"><title>{esc(hline[1])}</title></line>'
        )
    for i, (name, (ts, ys)) in enumerate(lines.items()):
        pts = " ".join(f"{px(t):.1f},{py(y):.1f}" for t, y in zip(ts, ys) if _plottable(y))
        color = COLORS[i % len(COLORS)]
        out.append(
            f'<polyline class="series" fill="none" stroke="{color}" stroke-width="1.5" points="{pts}">'
            f"<title>{esc(name)}</title></polyline>"
        )
        out.append(
            f'<text class="legend" x="{LEFT + 8}" y="{TOP + 16 + 14 * i}" style="fill:{color}">{esc(name)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


BUCKET_COLORS = (  # productive first, then one colour per loss (core/goodput.py BUCKETS order)
    "#2ca02c",
    "#9467bd",
    "#d62728",
    "#ff7f0e",
    "#ffbb78",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
    "#1f77b4",
    "#7f7f7f",
    "#393b79",
)


def swatch(color: str) -> str:
    return f'<span class="swatch" style="background:{color}"></span>'


def stacked_bar(parts: list[tuple[str, float, str]], total: float) -> str:
    """One horizontal bar of ``parts`` (label, seconds, colour) over ``total`` seconds."""
    out = [
        f'<svg class="chart bar" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} 40" '
        f'width="{WIDTH}" height="40" role="img" aria-label="goodput">'
    ]
    x = 0.0
    for label, seconds, color in parts:
        if seconds <= 0 or total <= 0:
            continue
        width = seconds / total * WIDTH
        out.append(
            f'<rect x="{x:.1f}" y="4" width="{max(width, 0.5):.1f}" height="32" fill="{color}">'
            f"<title>{esc(label)}: {esc(duration(seconds))} ({seconds / total * 100:.1f} %)</title></rect>"
        )
        x += width
    out.append("</svg>")
    return "\n".join(out)
