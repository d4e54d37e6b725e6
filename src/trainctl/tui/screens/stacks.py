"""The last stack dump (a stall's, or the one `d` wrote), read off the UI thread and shown
in a scrollable, searchable-by-eye view; escape closes it."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Label, TextArea

from trainctl.tui.background import in_background

MAX_BYTES = 2_000_000  # a dump of many ranks and workers stays well under this


def read_dump(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES)
    text = data.decode("utf-8", "replace")
    return text + ("\n… (cut: the file is longer)" if len(data) == MAX_BYTES else "")


class StacksScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,k", "dismiss", "Close", id="stacks.close", tooltip="Back to the dashboard")]

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def compose(self) -> ComposeResult:
        with Vertical(id="stacks-dialog"):
            yield Label(escape(f"Stacks: {self.path}"), id="stacks-title")
            yield TextArea(
                "reading…", read_only=True, id="stacks-text", soft_wrap=False, show_line_numbers=False
            )
            yield Label("arrows / PgUp / PgDn scroll · escape closes", id="stacks-help")

    def on_mount(self) -> None:
        self.query_one(TextArea).focus()
        in_background(self.app, lambda: read_dump(self.path), self._show, "stacks")

    def _show(self, text: str | None, error: BaseException | None) -> None:
        if not self.is_attached:
            return
        area = self.query_one(TextArea)
        if error is not None:
            text = f"cannot read {Path(self.path)}: {getattr(error, 'strerror', None) or error}"
        assert text is not None  # in_background gives a result or an error
        area.load_text(text)
