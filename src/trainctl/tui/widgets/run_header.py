"""The top line: job, host, preset, run state, attempt, auto-recovery, how many other runs
need attention (hidden when none), connection."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.markup import escape
from textual.reactive import reactive
from textual.widgets import Label

from trainctl.core.recovery import RunState
from trainctl.core.sanitize import sanitize

STATE_LABELS = {"BACKOFF": "RESTARTING"}
STATE_CLASSES = tuple(f"-{s.value.lower()}" for s in RunState)


@dataclass(frozen=True)
class HeaderInfo:
    """Everything the header shows; the dashboard sets a new one when anything changes."""

    job: str = ""
    host: str = ""
    preset: str | None = None
    state: str = "STARTING"
    attempt: int | None = None
    auto_recover: bool = True
    connected: bool = False
    connection: str = "connecting…"
    wide: bool = True  # narrow (80 columns): the job name first, shorter labels after it
    attention: int = 0  # other runs that need attention (src/trainctl/store/listing.py needs_attention)
    workers: int | None = None  # DataLoader workers seen in the trainer's tree (the last tick)


class RunHeader(Horizontal):
    """One line of labels; the state and connection labels are coloured by class."""

    info: reactive[HeaderInfo] = reactive(HeaderInfo, init=False)

    def compose(self) -> ComposeResult:
        yield Label("trainctl", id="hdr-job")
        yield Label("", id="hdr-preset")
        yield Label("", id="hdr-state")
        yield Label("", id="hdr-attempt")
        yield Label("", id="hdr-auto")
        yield Label("", id="hdr-attn")
        yield Label("", id="hdr-conn")

    def on_mount(self) -> None:
        self.watch_info(self.info)

    def watch_info(self, info: HeaderInfo) -> None:
        if not self.is_mounted:
            return
        where = f"{info.job}@{info.host}" if info.job and info.host else info.job or info.host
        job = f"trainctl · {where}" if where and info.wide else where or "trainctl"
        label = self.query_one("#hdr-job", Label)
        label.update(escape(job))
        # The job's name is what tells runs apart: the labels after it give way first (the
        # connection shrinks, then what does not fit is cut at the right edge).
        if info.wide:
            label.styles.min_width = min(len(job) + 2, 64)
        else:  # the name, then room for the ellipsis of "@host"
            name = info.job or where or "trainctl"
            label.styles.min_width = min(len(name) + (3 if len(name) < len(job) else 2), 40)
        seen = (  # measured: what is in effect (not shown narrow: the job's name comes first)
            f" · {info.workers} worker{'' if info.workers == 1 else 's'}"
            if info.workers is not None and info.wide
            else ""
        )
        self.query_one("#hdr-preset", Label).update(escape(f"preset {sanitize(info.preset or '?')}{seen}"))
        state = self.query_one("#hdr-state", Label)
        state.update(escape(f" {STATE_LABELS.get(info.state, info.state)} "))
        state.remove_class(*STATE_CLASSES)
        state.add_class(f"-{info.state.lower()}")
        self.query_one("#hdr-attempt", Label).update(
            f"attempt {info.attempt}" if info.attempt else "attempt —"
        )
        auto = self.query_one("#hdr-auto", Label)
        word = "auto-recover" if info.wide else "auto"
        auto.update(f"{word} on" if info.auto_recover else f"{word} OFF")
        auto.set_class(not info.auto_recover, "-off")
        attn = self.query_one("#hdr-attn", Label)
        attn.display = info.attention > 0
        n = info.attention
        attn.update(
            f"{n} other run{'s' if n != 1 else ''} need{'s' if n == 1 else ''} attention (g)"
            if info.wide
            else f"{n} need{'s' if n == 1 else ''} attention"
        )
        conn = self.query_one("#hdr-conn", Label)
        text = info.connection if info.wide else _short(info.connection)
        conn.update(("● " if info.connected else "○ ") + text)
        conn.tooltip = info.connection
        conn.set_class(not info.connected, "-down")


def _short(connection: str) -> str:
    """The connection label for 80 columns: "journal only: no agent running" -> "journal
    only", "disconnected (2) — retrying in 4s" -> "disconnected (2)"."""
    return connection.split(":", 1)[0].split(" — ", 1)[0]
