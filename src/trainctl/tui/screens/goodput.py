"""Where the run's time went (`t`): productive training and the losses by cause, from the
run's goodput (core/goodput.py) as it was when the key was pressed; escape closes it."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Static

from trainctl.core.goodput import BUCKETS, describe


def goodput_table(totals: dict[str, Any]) -> Table:
    """Productive, then every bucket (the biggest loss first): time and share of the wall."""
    wall = totals.get("wall_s") or 0.0
    rows = [("productive", totals.get("productive_s") or 0.0)]
    rows += sorted(((BUCKETS[k], v) for k, v in totals.get("buckets", {}).items()), key=lambda kv: -kv[1])
    table = Table.grid(padding=(0, 2))
    for name, seconds in rows:
        share = f"{seconds / wall * 100:5.1f} %" if wall else "-"
        table.add_row(name, f"{seconds / 60:8.1f} min", share, style="bold" if name == "productive" else "")
    table.add_row("wall time", f"{wall / 60:8.1f} min", "", style="dim")
    return table


class GoodputScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,q,t", "dismiss", "Close", id="goodput.close", tooltip="Back to the dashboard")
    ]

    def __init__(self, totals: dict[str, Any]) -> None:
        super().__init__()
        self.totals = totals

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="goodput-dialog"):
            yield Static(f"[b]{escape(describe(self.totals))}[/b]\n")
            yield Static(goodput_table(self.totals))
            yield Static(
                "\n[dim]Every second of the run is in one bucket; `trainctl report` draws it "
                "with the losses and the incidents.[/]"
            )
