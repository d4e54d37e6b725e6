"""Warnings, newest first, counted, coloured by severity; the advice of the selected row."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from trainctl.tui.model import WarningRow

SEVERITY_STYLES = {"info": "dim", "warning": "yellow", "error": "bold red",
                   "fatal": "bold white on red"}
SEVERITY_LABELS = {"info": "info", "warning": "warn", "error": "error", "fatal": "FATAL"}


class WarningsPanel(Vertical):
    """A row-cursor table; highlighting a row shows its text and advice below."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._rows: list[WarningRow] = []

    def compose(self) -> ComposeResult:
        table: DataTable[Text] = DataTable(cursor_type="row", id="warnings-table")
        table.add_columns("sev", "×", "warning")
        yield table
        yield Static("no warnings", id="warnings-advice")

    def on_mount(self) -> None:
        self.border_title = "Warnings"

    def show_rows(self, rows: list[WarningRow]) -> None:
        """Replace the rows (newest first), keeping the cursor on the same warning id."""
        table = self.query_one(DataTable)
        keep = self._rows[table.cursor_row].id if self._rows and table.cursor_row >= 0 else None
        self._rows = rows
        table.clear()
        for row in rows:
            style = SEVERITY_STYLES.get(row.severity, "")
            label = SEVERITY_LABELS.get(row.severity, row.severity)
            table.add_row(Text(label, style=style), Text(str(row.count), style=style),
                          Text(row.id, style=style), key=row.id)
        self.border_title = f"Warnings ({len(rows)})" if rows else "Warnings"
        if keep is not None:
            index = next((i for i, r in enumerate(rows) if r.id == keep), 0)
            table.move_cursor(row=index, animate=False)
        self._show_advice(table.cursor_row)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self._show_advice(event.cursor_row)

    def _show_advice(self, index: int) -> None:
        advice = self.query_one("#warnings-advice", Static)
        if not self._rows or not 0 <= index < len(self._rows):
            advice.update("no warnings")
            return
        row = self._rows[index]
        text = Text(row.text, style=SEVERITY_STYLES.get(row.severity, ""))
        if row.advice:
            text.append(f"\n→ {row.advice}")
        advice.update(text)
