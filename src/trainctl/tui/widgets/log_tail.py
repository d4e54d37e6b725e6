"""The raw trainer output (and trainctl's own notes, ``· trainctl:``): a bounded Log fed only
while it is shown.  It scrolls back (focus it: arrows, PgUp/PgDn, Home/End; new lines follow
only while it is at the end), pans sideways over long lines (←/→), and finds text (``/``,
then ``n`` for the next match further back)."""

from __future__ import annotations

from collections.abc import Iterable

from textual.widgets import Log

from trainctl.tui.model import LOG_KEEP

HINTS = "↑↓ PgUp/PgDn scroll · ←→ pan · / find · n next · l close"


def find_lines(lines: list[str], query: str, before: int | None = None) -> int | None:
    """The index of the last line holding ``query`` (any case) before line ``before`` (all
    lines when None), else None."""
    q = query.lower()
    end = len(lines) if before is None else min(before, len(lines))
    return next((i for i in range(end - 1, -1, -1) if q in lines[i].lower()), None)


class LogTail(Log):
    """Keeps at most ``LOG_KEEP`` lines; the dashboard refills it when it is shown."""

    can_focus = True

    def __init__(self, **kwargs: object) -> None:
        super().__init__(max_lines=LOG_KEEP, auto_scroll=True, **kwargs)  # type: ignore[arg-type]
        self.query_text = ""
        self.match: int | None = None  # the line of the last match shown

    def on_mount(self) -> None:
        self._title()
        self.border_subtitle = HINTS

    def _title(self, found: str = "") -> None:
        n = self.line_count
        self.border_title = f"Trainer output · {n:,} line{'s' if n != 1 else ''}" + (
            f" · {found}" if found else ""
        )

    def replace_lines(self, lines: Iterable[str]) -> None:
        self.clear()
        self.write_lines(list(lines))
        self._title()

    def append_lines(self, lines: Iterable[str]) -> None:
        self.write_lines(list(lines)[-LOG_KEEP:])
        self._title(self._found_text())

    def find(self, query: str, again: bool = False) -> int | None:
        """Scroll to the newest line holding ``query`` (``again``: the next one further
        back, wrapping round); the line's index, or None (said in the title)."""
        self.query_text = query
        lines = list(self.lines)
        start = self.match if again and self.match is not None else None
        index = find_lines(lines, query, start)
        if index is None and start is not None:
            index = find_lines(lines, query)  # wrap round to the newest
        self.match = index
        if index is not None:
            self.scroll_to(y=max(0, index - self.size.height // 2), animate=False)
        self._title(self._found_text())
        return index

    def _found_text(self) -> str:
        if not self.query_text:
            return ""
        if self.match is None:
            return f"“{self.query_text}” not found"
        total = sum(1 for line in self.lines if self.query_text.lower() in line.lower())
        return f"“{self.query_text}” at line {self.match + 1:,} ({total:,} match{'es' if total != 1 else ''})"
