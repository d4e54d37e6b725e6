"""Pick a preset to restart with: a list modal over the agent's ``list_presets``."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option


class PresetPicker(ModalScreen[str | None]):
    """Dismisses with the chosen preset's name, or None (escape) when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="picker.cancel", tooltip="Close without restarting")]

    def __init__(
        self, presets: list[dict[str, Any]], current: str | None, title: str = "Restart with which preset?"
    ) -> None:
        super().__init__()
        self._presets = presets
        self._current = current
        self._title = title

    def compose(self) -> ComposeResult:
        options = []
        for item in self._presets:
            name = str(item.get("name"))
            label = Text(name, style="bold")
            if name == self._current:
                label.append("  (running now)", style="dim")
            if item.get("description"):
                label.append(f"\n  {item['description']}", style="italic")
            options.append(Option(label, id=name))
        with Vertical(id="picker-dialog"):
            yield Label(self._title, id="picker-title")
            yield OptionList(*options, id="picker-list")
            yield Label("enter: restart with it · escape: cancel", id="picker-help")

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
