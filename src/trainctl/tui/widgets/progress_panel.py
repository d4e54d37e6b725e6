"""Epoch and batch counters, a progress bar, speed and time spent in this epoch."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Label, ProgressBar

from trainctl.core.projection_text import rate_phrase
from trainctl.tui import fmt


@dataclass(frozen=True)
class ProgressInfo:
    epoch: int | None = None
    epochs: int | None = None
    batch: int | None = None
    batches: int | None = None
    rate: float | None = None
    in_epoch_s: float | None = None
    phase: str | None = None
    rate_source: str | None = None  # measured (default), history, declared (a preset's figure)
    preset: str | None = None  # whose declared rate
    wide: bool = True


class ProgressPanel(Vertical):
    """Shows a :class:`ProgressInfo`; nothing here reads the clock."""

    info: reactive[ProgressInfo] = reactive(ProgressInfo, init=False)

    def compose(self) -> ComposeResult:
        yield Label("waiting for the first batch…", id="progress-counts")
        yield ProgressBar(show_eta=False, id="progress-bar")
        yield Label("", id="progress-speed")

    def on_mount(self) -> None:
        self.border_title = "Progress"
        self.watch_info(self.info)

    def watch_info(self, info: ProgressInfo) -> None:
        if not self.is_mounted:
            return
        counts = self.query_one("#progress-counts", Label)
        if info.batch is None and info.epoch is None:
            counts.update("waiting for the first batch…")
        else:
            counts.update(
                f"Epoch {fmt.count(info.epoch)}/{fmt.count(info.epochs)}   "
                f"Batch {fmt.count(info.batch)}/{fmt.count(info.batches)}"
            )
        bar = self.query_one(ProgressBar)
        if info.batches:
            bar.update(total=info.batches, progress=info.batch or 0)
        speed = rate_phrase(info.rate, info.rate_source, info.preset, compact=not info.wide) or "—"
        in_epoch = f"{fmt.duration(info.in_epoch_s)} in this epoch"
        self.query_one("#progress-speed", Label).update(f"{speed} · {in_epoch}")
