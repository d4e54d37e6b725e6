"""A yes/no modal for destructive actions; cancel (n, escape) dismisses with False."""

from __future__ import annotations

from rich.console import RenderableType
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static


class ConfirmScreen(ModalScreen[bool]):
    """Asks ``question``; ``body`` (text, a diff…) is shown scrollable under it."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes", tooltip="Do it"),
        Binding("n,escape", "answer(False)", "No", id="confirm.no", tooltip="Cancel: nothing is sent"),
    ]

    def __init__(
        self, question: str, body: RenderableType = "", *, yes: str = "Yes", danger: bool = True
    ) -> None:
        super().__init__()
        self._question = question
        self.body = body
        self._yes = yes
        self._danger = danger

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-dialog"):
            yield Label(self._question, id="confirm-question")
            if self.body:
                with VerticalScroll(id="confirm-body"):
                    yield Static(self.body)
            with Horizontal(id="confirm-buttons"):
                yield Button(
                    f"{self._yes} (y)", id="confirm-yes", variant="error" if self._danger else "primary"
                )
                yield Button("Cancel (n)", id="confirm-no")

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
