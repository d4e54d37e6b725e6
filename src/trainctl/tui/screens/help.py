"""The key list with what each key does, and what the run states mean."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Static

STATES = (
    ("RUNNING", "batches are coming"),
    ("STALLED", "no batch for longer than the phase's threshold"),
    ("RESTARTING", "killed; waiting before the next attempt (backoff)"),
    ("PENDING", "a Slurm run between jobs: saved; its next job waits in the queue"),
    ("FINISHED", "the trainer exited 0"),
    ("STOPPED", "stopped by the user (s, trainctl ctl stop, Ctrl-C)"),
    ("FAILED", "gave up: restart budget spent or a human must act"),
)
OTHER_RUNS = (
    "g lists every run of yours (here, on the hosts of hosts.toml, in Slurm): type to "
    "narrow, enter follows it here, escape goes back. The header's \"N other runs need "
    'attention" counts those stalled, failed, restarting, stopped by a fault, with '
    "their agent gone, or late for their deadline. A Slurm run with no agent shows its "
    "queued job (PENDING and why); s cancels it."
)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding(
            "escape,question_mark,q", "dismiss", "Close", id="help.close", tooltip="Back to the dashboard"
        )
    ]

    def __init__(self, bindings: list[Binding]) -> None:
        super().__init__()
        self._keys = bindings

    def compose(self) -> ComposeResult:
        keys = Table.grid(padding=(0, 2))
        for binding in self._keys:
            keys.add_row(
                f"[bold]{binding.key_display or binding.key}[/]",
                binding.description,
                f"[dim]{binding.tooltip}[/]",
            )
        keys.add_row("[bold]ctrl+p[/]", "Palette", "[dim]every action by name[/]")
        states = Table.grid(padding=(0, 2))
        for name, meaning in STATES:
            states.add_row(f"[bold]{name}[/]", meaning)
        with VerticalScroll(id="help-dialog"):
            yield Static("[b]Keys[/b]")
            yield Static(keys)
            yield Static("\n[b]Run states[/b]")
            yield Static(states)
            yield Static("\n[b]Other runs[/b]")
            yield Static(escape(OTHER_RUNS))
            yield Static("\n[dim]Quitting leaves the run going; `trainctl attach` comes back.[/]")
