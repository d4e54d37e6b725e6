"""Each loss over the global batch index, restarts as vertical lines; at most ~2 redraws/s.
The range (the whole run downsampled, the last hour, the last epoch) is in the title."""

from __future__ import annotations

import time
from dataclasses import dataclass

from textual.markup import escape
from textual.timer import Timer
from textual_plotext import PlotextPlot

MIN_INTERVAL = 0.5  # seconds between two redraws
COLORS = ("cyan", "magenta", "green", "yellow", "blue", "white")
SPAN_LABELS = {"run": "", "hour": " (last hour)", "epoch": " (this epoch)"}
PLOT_BELOW = 2  # rows under the plot: the x tick labels and the x label


@dataclass(frozen=True)
class ChartData:
    """Already downsampled series (name, xs, ys), restart marks (x, label), and the range
    they cover: "run", "hour" or "epoch"."""

    series: tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...] = ()
    restarts: tuple[tuple[float, str], ...] = ()
    span: str = "run"


class LossChart(PlotextPlot):
    """Set data with :meth:`show`; bursts of updates collapse into one redraw."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._pending: ChartData | None = None
        self._timer: Timer | None = None
        self._last_draw = 0.0
        self._shown = ChartData()
        self.draws = 0

    def on_mount(self) -> None:
        super().on_mount()
        self.border_title = "Loss"
        self._configure()
        self.refresh()

    def _configure(self) -> None:
        plt = self.plt
        plt.xlabel("global batch")
        plt.frame(False)
        plt.title("")

    def on_resize(self) -> None:
        # The y ticks and the legend's length follow the size: draw again at the new one.
        self.flush()

    def show(self, data: ChartData) -> None:
        """Take new data; draw now if the last draw was long enough ago, else soon."""
        self._pending = data
        if self._timer is not None:
            return
        wait = self._last_draw + MIN_INTERVAL - time.monotonic()
        if wait <= 0:
            self._draw()
        else:
            self._timer = self.set_timer(wait, self._draw)

    def flush(self) -> None:
        """Draw the newest data at once, at the current size (a resize, tests, screenshots)."""
        if self._timer is not None:
            self._timer.stop()
        if self._pending is None:
            self._pending = self._shown
        self._draw()

    def _draw(self) -> None:
        self._timer = None
        data, self._pending = self._pending, None
        if data is None:
            return
        self._last_draw = time.monotonic()
        self.draws += 1
        plt = self.plt
        plt.clear_data()
        for index, (_name, xs, ys) in enumerate(data.series):
            if xs:
                plt.plot(list(xs), list(ys), marker="braille", color=COLORS[index % len(COLORS)])
        for x, _label in data.restarts:
            plt.vline(x, "red")
        every_y = [y for _, xs, series_ys in data.series if xs for y in series_ys]
        if every_y:
            lo, hi = min(every_y), max(every_y)
            if hi - lo < 1e-12:
                lo, hi = lo - 0.5, hi + 0.5
            ticks = even_ticks(lo, hi, self.size.height - PLOT_BELOW)
            plt.ylim(lo, hi)
            plt.yticks([v for v, _ in ticks], [label for _, label in ticks])
        # The legend goes in the border: plotext draws its own over the curves.
        self._shown = data
        self.border_title = legend(data, short=self.size.width < 60)
        if not data.series:
            plt.title("no losses yet")
        else:
            plt.title("")
        self.refresh()


def even_ticks(lo: float, hi: float, rows: int) -> list[tuple[float, str]]:
    """Y labels that fall on evenly spaced rows of a ``rows``-high plot (plotext rounds each
    tick to a row: evenly spaced values alone land 2 or 3 rows apart, and one can vanish),
    about every 3 rows, all with the same number of decimals."""
    import math

    span = rows - 1
    if span < 1:
        return [(hi, f"{hi:.3g}")]
    steps = [d for d in range(1, span + 1) if span % d == 0]
    d = min(steps, key=lambda d: (abs(span / d - 3), -d))  # n - 1 gaps of span / d rows
    step = (hi - lo) / d
    decimals = max(0, min(6, 1 - math.floor(math.log10(step)))) if step > 0 else 2
    return [(lo + step * k, f"{lo + step * k:.{decimals}f}") for k in range(d + 1)]


def legend(data: ChartData, short: bool = False) -> str:
    """'Loss ━ box_loss ━ cls_loss │ restart' in the curves' colours (markup for a border
    title); ``short`` drops a "_loss" suffix (80 columns)."""
    parts = ["Loss" + SPAN_LABELS.get(data.span, "")]
    for index, (name, _xs, _ys) in enumerate(data.series):
        label = name[:-5] if short and name.endswith("_loss") and len(name) > 5 else name
        label = escape(label)
        parts.append(f"[{COLORS[index % len(COLORS)]}]━ {label}[/]")
    if data.restarts:
        parts.append("[red]│ restart[/]")
    return " ".join(parts)
