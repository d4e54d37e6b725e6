"""What needs a person, in words: warnings and errors, newest first, counted, coloured by
severity; the full text and advice of the selected row below.  trainctl's own notes (info:
"integration attached", "auto-recovery off", a save that took 2 s) are not warnings: they go
to the log view (``l``), and acknowledgements are toasts.  ``x`` dismisses the selected
row until it happens again (its count grows)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from trainctl.tui.model import WarningRow

SEVERITY_STYLES = {"info": "dim", "warning": "yellow", "error": "bold red", "fatal": "bold white on red"}
SEVERITY_LABELS = {"info": "info", "warning": "warn", "error": "error", "fatal": "FATAL"}
NEEDS_A_PERSON = ("warning", "error", "fatal")


def shown_rows(rows: list[WarningRow], dismissed: dict[str, int]) -> list[WarningRow]:
    """The rows the panel shows: not info, and not dismissed at the count they have now."""
    return [r for r in rows if r.severity in NEEDS_A_PERSON and dismissed.get(r.id, -1) < r.count]


def first_line(text: str) -> str:
    return text.split("\n", 1)[0]


class WarningsPanel(Vertical):
    """A row-cursor table; highlighting a row shows its text and advice below."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._all: list[WarningRow] = []
        self._rows: list[WarningRow] = []
        self.dismissed: dict[str, int] = {}  # id -> the count it had when dismissed

    def compose(self) -> ComposeResult:
        table: DataTable[Text] = DataTable(cursor_type="row", id="warnings-table")
        table.add_columns("sev", "×", "what")
        yield table
        yield Static("no warnings", id="warnings-advice")

    def on_mount(self) -> None:
        self.border_title = "Warnings"

    @property
    def rows(self) -> list[WarningRow]:
        return list(self._rows)

    def show_rows(self, rows: list[WarningRow]) -> None:
        """Replace the rows (newest first), keeping the cursor on the same warning."""
        self._all = rows
        table = self.query_one(DataTable)
        keep = (
            self._rows[table.cursor_row].id
            if self._rows and 0 <= table.cursor_row < len(self._rows)
            else None
        )
        self._rows = shown = shown_rows(rows, self.dismissed)
        table.clear()
        for row in shown:
            style = SEVERITY_STYLES.get(row.severity, "")
            label = SEVERITY_LABELS.get(row.severity, row.severity)
            table.add_row(
                Text(label, style=style),
                Text(str(row.count), style=style),
                Text(first_line(row.text) or row.id, style=style),
                key=row.id,
            )
        hidden = sum(1 for r in rows if r.severity in NEEDS_A_PERSON) - len(shown)
        title = f"Warnings ({len(shown)})" if shown else "Warnings"
        self.border_title = title
        self.border_subtitle = f"x dismiss · {hidden} dismissed" if hidden else "x dismiss" if shown else ""
        if keep is not None:
            index = next((i for i, r in enumerate(shown) if r.id == keep), 0)
            table.move_cursor(row=index, animate=False)
        self._show_advice(table.cursor_row)

    def dismiss_selected(self) -> WarningRow | None:
        """Hide the highlighted row until it happens again; the row dismissed, or None."""
        table = self.query_one(DataTable)
        if not self._rows or not 0 <= table.cursor_row < len(self._rows):
            return None
        row = self._rows[table.cursor_row]
        self.dismissed[row.id] = row.count
        self.show_rows(self._all)
        return row

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self._show_advice(event.cursor_row)

    def _show_advice(self, index: int) -> None:
        advice = self.query_one("#warnings-advice", Static)
        if not self._rows or not 0 <= index < len(self._rows):
            advice.update("nothing needs you" if self._all else "no warnings")
            return
        row = self._rows[index]
        text = Text(row.text, style=SEVERITY_STYLES.get(row.severity, ""))
        if row.advice:
            text.append(f"\n→ {row.advice}")
        advice.update(text)
