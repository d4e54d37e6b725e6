"""What the dashboard knows about the run: the engine's :class:`RunView` (the one model of
what a client shows, folded from journal events, restorable from a snapshot) plus what
only a live dashboard sees: the newest tick (stall meter, resources) and the raw log tail.

Applying half a million replayed events is a tight loop with no drawing; the screen then
pushes the result down to its widgets once per batch.  Texts are sanitised in the view
(:mod:`trainctl.core.runview`) before any widget shows them.
"""

from __future__ import annotations

from collections import deque

from trainctl.core import events as ev
from trainctl.core.runview import RankRow, RunView, WarningRow
from trainctl.core.sanitize import sanitize
from trainctl.core.series import CHART_POINTS, Series

__all__ = ["CHART_POINTS", "LOG_KEEP", "RankRow", "RunModel", "Series", "WarningRow"]

LOG_KEEP = 5000  # raw log lines kept for the log view (its scroll-back)
NOTE_PREFIX = "· trainctl: "  # trainctl's own notes, as lines of the log view


class RunModel(RunView):
    """The run's view, with the live tick and log lines; ``version`` bumps on every change."""

    def __init__(self) -> None:
        super().__init__()
        self.tick: ev.Tick | None = None
        self.log: deque[str] = deque(maxlen=LOG_KEEP)
        self.notes: list[str] = []

    def apply_tick(self, tick: ev.Tick) -> None:
        self.tick = tick
        self.auto_recover = tick.auto_recover
        if tick.phase:
            self.phase = tick.phase
        self.version += 1

    def _on_info_noted(self, e: ev.Info) -> None:
        """trainctl's own notes are no warnings: the log view shows them among the trainer's
        lines (``NOTE_PREFIX``); the view keeps them too (``status``, the snapshot)."""
        RunView._on_info(self, e)
        line = NOTE_PREFIX + sanitize(e.text)
        self.log.append(line)
        self.notes.append(line)

    _handlers = {**RunView._handlers, "info": _on_info_noted}

    def take_notes(self) -> tuple[str, ...]:
        """The notes since the last call (the screen appends them to a shown log view)."""
        out, self.notes = tuple(self.notes), []
        return out

    def apply_log(self, lines: tuple[str, ...]) -> tuple[str, ...]:
        """Keep the raw log lines (sanitised); returns them as kept, for the log view."""
        lines = tuple(sanitize(line) for line in lines)
        self.log.extend(lines)
        return lines
