"""The raw trainer output: a bounded Log fed only while it is shown."""
from __future__ import annotations

from collections.abc import Iterable

from textual.widgets import Log

from trainctl.tui.model import LOG_KEEP


class LogTail(Log):
    """Keeps at most ``LOG_KEEP`` lines; the dashboard refills it when it is shown."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(max_lines=LOG_KEEP, auto_scroll=True, **kwargs)  # type: ignore[arg-type]

    def on_mount(self) -> None:
        self.border_title = "Trainer output"

    def replace_lines(self, lines: Iterable[str]) -> None:
        self.clear()
        self.write_lines(list(lines))

    def append_lines(self, lines: Iterable[str]) -> None:
        self.write_lines(list(lines)[-LOG_KEEP:])
