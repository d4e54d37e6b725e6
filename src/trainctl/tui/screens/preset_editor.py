"""Edit a preset: a form over every field, validated on each change like the engine does.

Saving shows the diff in a confirm modal, then sends ``write_preset`` (so it works on a
remote agent too); "save and restart" follows with ``switch_preset``, "save for next
restart" with ``set_next_preset``; "new preset from this one" asks a name and writes a
copy.  The text is rebuilt from the original with tomlkit, so comments survive.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from rich.syntax import Syntax
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Button, Footer, Input, Label, Select, Static, TextArea
from textual.worker import Worker, WorkerState

from trainctl.config import ConfigError, diff_text
from trainctl.tui.preset_form import FIELDS, Field, build_text, field_for, form_values
from trainctl.tui.screens.confirm import ConfirmScreen
from trainctl.tui.screens.name_prompt import NamePrompt

Command = Callable[..., Awaitable[dict[str, Any]]]


class PresetEditorScreen(Screen[None]):
    """``preset`` is ``read_preset``'s result: ``{"name", "path", "text"}``."""

    BINDINGS = [
        Binding("ctrl+s", "save(None)", "Save", id="editor.save", tooltip="Save (after showing the diff)"),
        Binding(
            "ctrl+r",
            "save('restart')",
            "Save+restart",
            id="editor.save_restart",
            tooltip="Save, then restart the run with this preset",
        ),
        Binding(
            "ctrl+t",
            "save('next')",
            "Save for next",
            id="editor.save_next",
            tooltip="Save, and use this preset at the next restart",
        ),
        Binding(
            "ctrl+n",
            "new_preset",
            "New from this",
            id="editor.new",
            tooltip="Save these values as a new preset under another name",
        ),
        Binding(
            "escape",
            "close",
            "Close",
            id="editor.close",
            tooltip="Back to the dashboard (asks when there are unsaved changes)",
        ),
    ]

    def __init__(self, preset: dict[str, Any], command: Command) -> None:
        super().__init__()
        self.preset_name = str(preset["name"])
        self.path = str(preset.get("path") or f"{self.preset_name}.toml")
        self.saved_text = str(preset["text"])
        self._command = command
        self._values = form_values(self.saved_text)
        self.text = self.saved_text
        self.problems: list[ConfigError] = []

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Label("", id="editor-title")
        with VerticalScroll(id="editor-form"):
            section = ""
            for f in FIELDS:
                if (f.section or "") != section and f.kind not in ("table", "env"):
                    section = f.section or ""
                    if section:
                        yield Label(Text(f"[{section}]"), classes="editor-section")
                with Vertical(classes="editor-field", id=f"row-{f.id}"):
                    with Horizontal(classes="editor-line"):
                        yield Label(Text(f.key or f"[{f.section}]"), classes="editor-label")
                        yield self._widget(f)
                        yield Label(Text(f.help), classes="editor-help")
                    yield Label("", classes="editor-error", id=f"error-{f.id}")
        yield Static("", id="editor-problems")
        with Horizontal(id="editor-buttons"):
            yield Button("Save", id="save", variant="primary", compact=True, tooltip="Save (ctrl+s)")
            yield Button(
                "Save+restart",
                id="save-restart",
                variant="warning",
                compact=True,
                tooltip="Save, then restart the run with this preset (ctrl+r)",
            )
            yield Button(
                "Save for next",
                id="save-next",
                compact=True,
                tooltip="Save; the next restart uses this preset (ctrl+t)",
            )
            yield Button(
                "New from this…", id="new", compact=True, tooltip="A new preset with these values (ctrl+n)"
            )
            yield Button("Close", id="close", compact=True, tooltip="Back (escape)")
        yield Footer()

    def _widget(self, f: Field) -> Widget:
        value = self._values.get(f.id, "")
        wid = f"field-{f.id}"
        if f.kind in ("bool", "choice"):
            choices = ("true", "false") if f.kind == "bool" else f.choices
            if value and value not in choices:
                choices = (*choices, value)  # keep a bad value visible until it is fixed
            return Select(
                [(c, c) for c in choices],
                value=value or Select.NULL,
                prompt="(not set)",
                allow_blank=True,
                id=wid,
                compact=True,
            )
        if f.kind in ("table", "env"):
            return TextArea(value, id=wid, classes="editor-table", soft_wrap=False)
        return Input(value, id=wid, placeholder="(not set)", compact=True)

    def on_mount(self) -> None:
        self._show_title()
        self.validate()

    def on_resize(self) -> None:
        footer = self.query_one(Footer)
        footer.compact = self.size.width < 120
        footer.show_command_palette = self.size.width >= 120

    def _show_title(self) -> None:
        title = Text.assemble("Preset ", (self.preset_name, "bold"), f"  ·  {self.path}")
        self.query_one("#editor-title", Label).update(title)

    # ------------------------------------------------------------------ validation
    @on(Input.Changed)
    @on(Select.Changed)
    @on(TextArea.Changed)
    def _changed(self, event: Input.Changed | Select.Changed | TextArea.Changed) -> None:
        widget = event.control if not isinstance(event, TextArea.Changed) else event.text_area
        if widget is None or not (widget.id or "").startswith("field-"):
            return
        field_id = (widget.id or "").removeprefix("field-")
        if isinstance(widget, Select):
            value = widget.value
            self._values[field_id] = "" if value == Select.NULL else str(value)
        elif isinstance(widget, TextArea):
            self._values[field_id] = widget.text
        else:
            self._values[field_id] = widget.value
        self.validate()

    def validate(self) -> None:
        """Rebuild the text from the form and show every problem by its field."""
        self.text, self.problems = build_text(self.saved_text, self._values, self.path)
        by_field: dict[str, list[str]] = {}
        loose: list[str] = []
        for problem in self.problems:
            field_id = field_for(problem)
            message = f"{problem.key}: {problem.message}" if problem.key else problem.message
            (by_field.setdefault(field_id, []) if field_id else loose).append(message)
        for f in FIELDS:
            messages = by_field.get(f.id, [])
            self.query_one(f"#error-{f.id}", Label).update(Text("\n".join(messages)))
            self.query_one(f"#row-{f.id}").set_class(bool(messages), "-invalid")
        summary = self.query_one("#editor-problems", Static)
        if self.problems:
            summary.update(Text("\n".join("✗ " + p.describe() for p in self.problems)))
        else:
            dirty = " · unsaved changes" if self.dirty else ""
            summary.update(f"✓ valid{dirty}")
        summary.set_class(bool(self.problems), "-invalid")
        for button in self.query("#editor-buttons Button"):
            if button.id != "close":
                button.disabled = bool(self.problems)

    @property
    def dirty(self) -> bool:
        return self.text != self.saved_text

    # ------------------------------------------------------------------ actions
    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        actions = {
            "save": lambda: self.action_save(None),
            "save-restart": lambda: self.action_save("restart"),
            "save-next": lambda: self.action_save("next"),
            "new": self.action_new_preset,
            "close": self.action_close,
        }
        actions[event.button.id or "close"]()

    def action_save(self, then: str | None) -> None:
        if self.problems:
            self.notify(self.problems[0].describe(), title="Fix the preset first", severity="error")
            return
        self._save(then)

    @work(group="editor", exclusive=True, exit_on_error=False)
    async def _save(self, then: str | None) -> None:
        text = self.text
        if text != self.saved_text:
            diff = Syntax(
                diff_text(self.saved_text, text, self.path), "diff", theme="ansi_dark", word_wrap=True
            )
            if not await self.app.push_screen_wait(
                ConfirmScreen(f"Save preset {self.preset_name}?", diff, yes="Save", danger=False)
            ):
                return
            if not await self._call("write_preset", name=self.preset_name, text=text):
                return
            self.saved_text = text
            self.validate()
            self.notify(f"saved {self.path}", title="Preset saved")
        elif then is None:
            self.notify("nothing changed", title="Preset")
            return
        if then == "restart" and await self._call("switch_preset", preset=self.preset_name):
            self.notify(f"restarting with {self.preset_name}", title="Restart")
        elif then == "next" and await self._call("set_next_preset", name=self.preset_name):
            self.notify(f"the next restart uses {self.preset_name}", title="Preset")

    def action_new_preset(self) -> None:
        if self.problems:
            self.notify(self.problems[0].describe(), title="Fix the preset first", severity="error")
            return
        self._new_preset()

    @work(group="editor", exclusive=True, exit_on_error=False)
    async def _new_preset(self) -> None:
        listed = await self._command("list_presets")
        taken = {str(p.get("name")) for p in listed.get("result") or []} if listed.get("ok") else set()
        name = await self.app.push_screen_wait(
            NamePrompt(f"New preset from {self.preset_name}: its name?", taken)
        )
        if not name:
            return
        reply = await self._call("write_preset", name=name, text=self.text, result=True)
        if reply is None:
            return
        self.preset_name = name
        self.path = str((reply.get("result") or {}).get("path") or f"{name}.toml")
        self.saved_text = self.text
        self._show_title()
        self.validate()
        self.notify(f"created preset {name}", title="Preset saved")

    async def _call(self, command: str, /, *, result: bool = False, **args: Any) -> Any:
        """Send a command; on failure notify with the agent's error and return None."""
        reply = await self._command(command, **args)
        if not reply.get("ok"):
            self.notify(
                str(reply.get("error") or "failed"), title=f"{command} failed", severity="error", timeout=8
            )
            return None
        return reply if result else True

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            self.notify(repr(event.worker.error), title="Editor error", severity="error")

    def action_close(self) -> None:
        self._close()

    @work(group="editor", exclusive=True, exit_on_error=False)
    async def _close(self) -> None:
        if self.dirty and not await self.app.push_screen_wait(
            ConfirmScreen("Discard unsaved changes?", yes="Discard")
        ):
            return
        self.dismiss(None)
