"""Each loss over the global batch index, restarts as vertical lines; at most ~2 redraws/s.
The range (the whole run downsampled, the last hour, the last epoch) is in the title."""
from __future__ import annotations

import time
from dataclasses import dataclass

from textual.markup import escape
from textual.timer import Timer
from textual_plotext import PlotextPlot

MIN_INTERVAL = 0.5   # seconds between two redraws
COLORS = ("cyan", "magenta", "green", "yellow", "blue", "white")
SPAN_LABELS = {"run": "", "hour": " (last hour)", "epoch": " (this epoch)"}


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
        self.border_title = legend(self._shown, short=self.size.width < 60)

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
        """Draw pending data at once (tests and screenshots)."""
        if self._timer is not None:
            self._timer.stop()
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
        for index, (name, xs, ys) in enumerate(data.series):
            if xs:
                plt.plot(list(xs), list(ys), marker="braille", color=COLORS[index % len(COLORS)])
        for x, _label in data.restarts:
            plt.vline(x, "red")
        # The legend goes in the border: plotext draws its own over the curves.
        self._shown = data
        self.border_title = legend(data, short=self.size.width < 60)
        if not data.series:
            plt.title("no losses yet")
        else:
            plt.title("")
        self.refresh()


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
