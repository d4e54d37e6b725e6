"""Seconds since the last batch against the current phase's threshold, and the last stall."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from trainctl.tui import fmt

BAR_WIDTH = 24


@dataclass(frozen=True)
class StallInfo:
    phase: str | None = None
    idle_s: float | None = None
    threshold_s: float | None = None
    stalled: bool = False
    diagnosis: str | None = None
    stall_phase: str | None = None
    stall_idle_s: float | None = None
    detail: str = ""
    stacks: str | None = None
    wide: bool = True
    ended: str | None = None  # a final state: nothing left to watch
    go_on: str = ""  # how to go on from a run that ended (a command)


class StallMeter(Static):
    """A meter that fills as the run goes quiet; classes -warn / -alarm colour it."""

    info: reactive[StallInfo] = reactive(StallInfo, init=False)

    def on_mount(self) -> None:
        self.border_title = "Stall watch"
        self.watch_info(self.info)

    def watch_info(self, info: StallInfo) -> None:
        fraction = None
        if info.idle_s is not None and info.threshold_s:
            fraction = info.idle_s / info.threshold_s
        if info.ended:
            fraction = None
        self.set_class(fraction is not None and 0.5 <= fraction < 1.0, "-warn")
        self.set_class(info.stalled or (fraction is not None and fraction >= 1.0), "-alarm")
        self.set_class(bool(info.ended), "-ended")
        self.update(self.render_info(info, fraction))

    @staticmethod
    def render_info(info: StallInfo, fraction: float | None) -> Text:
        text = Text(no_wrap=not info.ended, overflow="ellipsis")
        phase = info.phase or "—"
        if info.ended:
            text.append(f"run {info.ended}: nothing left to watch", style="dim")
            if info.go_on:
                text.append(f"\nto go on: {info.go_on}")
        elif info.idle_s is None:
            text.append(f"{phase}: no reading yet\n")
        elif info.threshold_s:
            text.append(f"{phase}: idle {fmt.duration(info.idle_s)} of {fmt.duration(info.threshold_s)}\n")
        else:
            text.append(f"{phase}: idle {fmt.duration(info.idle_s)} (limit: still learning)\n")
        if not info.ended:
            filled = 0 if fraction is None else min(BAR_WIDTH, round(fraction * BAR_WIDTH))
            text.append("█" * filled, style="bold")
            text.append("░" * (BAR_WIDTH - filled), style="dim")
        if info.diagnosis:
            label = "STALLED" if info.stalled else "last stall"
            text.append(
                f"\n{label}: {info.diagnosis}, {fmt.duration(info.stall_idle_s)}"
                f" idle in {info.stall_phase or '?'}"
            )
            if info.detail and info.wide:
                text.append(f"\n{info.detail}", style="italic")
            if info.stacks:
                text.append(f"\nstacks: {info.stacks}", style="dim")
        return text
