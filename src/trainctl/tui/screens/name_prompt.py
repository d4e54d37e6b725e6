"""Ask for a new preset name (letters, digits, ``_`` and ``-``)."""

from __future__ import annotations

import re

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

NAME = re.compile(r"[A-Za-z0-9_-]+\Z")


class NamePrompt(ModalScreen[str | None]):
    """Dismisses with a valid name, or None on escape."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="name.cancel", tooltip="No new preset")]

    def __init__(self, question: str, taken: set[str] | None = None) -> None:
        super().__init__()
        self._question = question
        self._taken = taken or set()

    def compose(self) -> ComposeResult:
        with Vertical(id="name-dialog"):
            yield Label(self._question)
            yield Input(placeholder="e.g. A2", id="name-input")
            yield Label("", id="name-error")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        name = event.value.strip()
        error = self.query_one("#name-error", Label)
        if not NAME.match(name):
            error.update("name: letters, digits, _ and - only")
        elif name in self._taken:
            error.update(f"name: {name} already exists; choose another")
        else:
            self.dismiss(name)

    def action_cancel(self) -> None:
        self.dismiss(None)
