"""Pick another run to follow: every run of this user, as `trainctl ls` lists them (local,
on the ssh hosts of hosts.toml, Slurm jobs), gathered off the UI thread (journals, squeue
and ssh can take seconds).  Typing narrows the list (backspace undoes); enter switches the
dashboard to the run; escape cancels."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

from trainctl.store.listing import COLUMNS, needs_attention, row_cells, row_key
from trainctl.tui import fmt
from trainctl.tui.background import in_background


@dataclass(frozen=True)
class PickerRow:
    """One line of the picker: the run's `ls` cells, marked when it is the one on screen
    (``current``) or needs attention (the first cell, ``!``); ``row`` is the `ls` row."""

    key: tuple[str, str]
    cells: tuple[str, ...]
    current: bool
    attention: str | None
    row: dict

    @property
    def selectable(self) -> bool:
        return not self.row.get("error") and not self.current


def picker_rows(rows: list[dict], current: tuple[str, str] | None, typed: str = "") -> list[PickerRow]:
    """The picker's lines, in `ls` order; the run on screen is marked "▶", one that needs
    attention "!" (why: ``attention``); with ``typed``, only the runs whose cells hold it
    (any case)."""
    out = []
    for r in rows:
        key = row_key(r)
        if typed and typed.lower() not in " ".join(row_cells(r)).lower():
            continue
        why = needs_attention(r)
        mark = "▶" if key == current else "!" if why else " "
        cells = list(row_cells(r))
        if not r.get("error") and not r.get("slurm") and r.get("where", "local") == "local":
            cells[2] = short_run_dir(str(r["run_dir"]))
        out.append(PickerRow(key, (mark, *cells), key == current, why, r))
    return out


def short_run_dir(run_dir: str, root: str | None = None) -> str:
    """A local run directory as the picker shows it: its name alone under the default
    runs folder (``demo-20261127-130501``: the part that tells runs apart is not cut off
    by a long common prefix), else the path with ``~`` for the home directory."""
    from trainctl.store.paths import runs_dir

    base = (root or str(runs_dir())).rstrip("/")
    if run_dir.startswith(base + "/") and "/" not in run_dir[len(base) + 1 :].rstrip("/"):
        return run_dir[len(base) + 1 :].rstrip("/")
    return fmt.home_path(run_dir)


class RunPicker(ModalScreen[dict | None]):
    """Dismisses with the chosen run's `ls` row, or None (escape)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="runs.cancel", tooltip="Back to the run on screen")]

    def __init__(self, gather: Callable[[], list[dict]], current: tuple[str, str] | None) -> None:
        super().__init__()
        self._gather = gather
        self._current = current
        self._listed: list[dict] | None = None  # every run gathered
        self.typed = ""  # the filter typed so far
        self.rows: list[PickerRow] | None = None  # the lines shown

    def compose(self) -> ComposeResult:
        with Vertical(id="runs-dialog"):
            yield Label("Follow which run?", id="picker-title")
            yield Label("gathering your runs (local, ssh hosts, Slurm)…", id="runs-status")
            yield DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
            yield Label(
                "type to filter · enter: follow it · escape: cancel   (! needs attention, ▶ on screen)",
                id="picker-help",
            )

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("", *COLUMNS)
        table.focus()
        in_background(self.app, self._gather, self._show, "picker")

    def _show(self, listed: list[dict] | None, error: BaseException | None) -> None:
        if not self.is_attached:
            return  # cancelled meanwhile
        if error is not None:  # shown; the picker stays usable (escape)
            self.query_one("#runs-status", Label).update(
                escape(f"cannot list the runs: {type(error).__name__}: {error}")
            )
            return
        self._listed = listed
        self._fill()

    def _fill(self) -> None:
        if self._listed is None:
            return
        self.rows = rows = picker_rows(self._listed, self._current, self.typed)
        table = self.query_one(DataTable)
        table.clear()
        for i, r in enumerate(rows):
            table.add_row(*(escape(c) for c in r.cells), key=str(i))
        first = next((i for i, r in enumerate(rows) if r.selectable), 0)
        if rows:
            table.move_cursor(row=first)
        need = sum(1 for r in rows if r.attention and not r.current)
        typed = f" matching “{self.typed}”" if self.typed else ""
        self.query_one("#runs-status", Label).update(
            escape(
                f"{len(rows)} run{'s' if len(rows) != 1 else ''}{typed}"
                + (f", {need} need attention" if need else "")
                if rows
                else f"no runs{typed or ' found here or on the hosts of hosts.toml'}"
            )
        )

    def on_key(self, event) -> None:
        """Printable keys narrow the list; backspace takes the last one back."""
        if event.key == "backspace" and self.typed:
            self.typed = self.typed[:-1]
        elif (
            event.character
            and event.character.isprintable()
            and event.key != "space"
            and len(event.character) == 1
        ):
            self.typed += event.character
        else:
            return
        event.stop()
        event.prevent_default()
        self._fill()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if self.rows is None:
            return
        key = event.row_key.value
        assert key is not None  # every row is added with its index as key
        picked = self.rows[int(key)]
        if picked.row.get("error"):
            self.notify(escape(picked.row["error"]), severity="warning")
        elif picked.current:
            self.dismiss(None)
        else:
            self.dismiss(picked.row)

    def action_cancel(self) -> None:
        self.dismiss(None)
