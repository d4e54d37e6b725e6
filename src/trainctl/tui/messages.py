"""Messages the bridge posts to the dashboard: the only way agent data enters the UI.

The bridge batches: one :class:`EventBatch` carries every journal event that arrived
in a short window (or a few thousand replayed ones), the newest tick and the new log
lines, so a week-long journal or a trainer printing 10,000 lines/s costs a handful of
messages, not one per event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from textual.message import Message

from trainctl.core.events import Event, Tick
from trainctl.core.runview import ViewSnapshot


@dataclass
class AgentConnected(Message, bubble=False):
    """The agent said hello; journal events from ``since`` on follow."""

    hello: dict[str, Any]
    since: int
    gen: int = 0  # the bridge's generation: a message of a run switched away from is dropped


@dataclass
class AgentDisconnected(Message, bubble=False):
    """The connection dropped (or could not be made); the bridge retries in ``retry_in`` s."""

    reason: str
    retry_in: float
    attempts: int = 1
    gen: int = 0


@dataclass
class EventBatch(Message, bubble=False):
    """Journal events in order, the newest tick, and raw log lines (oldest first);
    ``snapshot``: the run's view up to the first of these events (taken before them)."""

    events: tuple[Event, ...] = ()
    tick: Tick | None = None
    log_lines: tuple[str, ...] = ()
    dropped_lines: int = field(default=0)
    snapshot: ViewSnapshot | None = None
    gen: int = 0


@dataclass
class CommandDone(Message, bubble=False):
    """The agent answered a command: ``reply`` is ``{"ok", "error", "result"}``."""

    name: str
    args: dict[str, Any]
    reply: dict[str, Any]

    @property
    def ok(self) -> bool:
        return bool(self.reply.get("ok"))

    @property
    def error(self) -> str:
        return str(self.reply.get("error") or "unknown error")

    @property
    def result(self) -> Any:
        return self.reply.get("result")
