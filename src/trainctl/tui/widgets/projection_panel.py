"""ETA, deadline buffer (red when negative), cost against budget, and the what-if lines."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from trainctl.core.events import Projection
from trainctl.core.projection_text import (
    checkpoint_phrase,
    eta_phrase,
    format_money,
    format_projection,
    format_what_if,
    format_when,
    hours_phrase,
    rate_phrase,
    scope_phrase,
    signed_duration,
)


@dataclass(frozen=True)
class ProjectionInfo:
    projection: Projection | None = None
    now: float = 0.0
    wide: bool = True
    ended: str | None = None  # a final state: a projection that is not the end is stale
    ladder: str | None = None  # the agent's line about the run's ladder (live runs only)
    goodput: str | None = None  # its line (core/goodput.py describe), under the projection


def _compact_lines(p: Projection, now: float) -> list[str]:
    """The same facts as ``format_projection`` in lines of at most ~36 columns."""
    lines = [eta_phrase(p, now, compact=True) if p.eta is not None else "ETA unknown"]
    if p.rate_source in ("declared", "history") and p.rate:
        lines[0] += f" at {rate_phrase(p.rate, p.rate_source, p.preset, compact=True)}"
    if p.deadline is not None:
        lines.append(f"deadline {format_when(p.deadline, now)}: {signed_duration(p.buffer_s)}")
    if p.cost_so_far is not None:
        budget = f" of {format_money(p.budget)}" if p.budget is not None else ""
        cost = format_money(p.cost_so_far)
        if not p.finished:
            cost += f" → {format_money(p.cost_at_eta)}"
        lines.append(f"cost {cost}{budget}")
    if p.checkpoint and not p.finished:
        lines.append(checkpoint_phrase(p.checkpoint, now, compact=True))
    for w in p.what_if:
        buffer = f" {signed_duration(w['buffer_s'])}" if w.get("buffer_s") is not None else ""
        guess = {"declared": " (declared)", "scaled": " (~declared)"}.get(w.get("source") or "", "")
        risk = w.get("risk") or {}
        if risk.get("incidents"):
            scope = scope_phrase(risk, compact=True)
            guess += f" ({risk['incidents']} in {hours_phrase(float(risk.get('hours', 0.0)))}"
            guess += f", {scope})" if scope else ")"
        lines.append(f"{w.get('preset', '?')}{guess}: ETA {format_when(w.get('eta'), now)}{buffer}")
    return lines


def projection_text(p: Projection | None, now: float, wide: bool = True, ended: str | None = None) -> Text:
    """``format_projection``'s lines (compact ones when narrow), late and over-budget in red.
    A run that ended (``ended``: STOPPED, FAILED) before its end projection has no ETA: its
    last live one is not shown as if it were still coming."""
    if p is None:
        return Text(f"run {ended.lower()}: no ETA" if ended else "no projection yet", style="dim")
    if ended and not p.finished:
        return Text(f"run {ended.lower()}: no ETA", style="dim")
    lines = format_projection(p, now) if wide else _compact_lines(p, now)
    late = p.buffer_s is not None and p.buffer_s < 0
    over = None not in (p.budget, p.cost_at_eta) and p.cost_at_eta > p.budget  # type: ignore[operator]
    what_if = {format_what_if(w, now) for w in p.what_if} if wide else set()
    text = Text(no_wrap=True, overflow="ellipsis")
    for index, line in enumerate(lines):
        style = ""
        if line.startswith("deadline"):
            style = "bold red" if late else "green"
        elif line.startswith("cost"):
            style = "bold red" if over else ""
        elif line in what_if or (not wide and index >= len(lines) - len(p.what_if)):
            style = "italic"
        text.append(line + ("\n" if index < len(lines) - 1 else ""), style=style)
    return text


class ProjectionPanel(Static):
    """Renders a :class:`ProjectionInfo`; ``-late`` class when the buffer is negative."""

    info: reactive[ProjectionInfo] = reactive(ProjectionInfo, init=False)

    def on_mount(self) -> None:
        self.border_title = "Deadline"
        self.watch_info(self.info)

    def watch_info(self, info: ProjectionInfo) -> None:
        p = info.projection
        self.set_class(p is not None and p.buffer_s is not None and p.buffer_s < 0, "-late")
        text = projection_text(p, info.now, info.wide, info.ended)
        if info.ladder and not info.ended:
            text.append("\n" + info.ladder, style="bold")
        if info.goodput and info.goodput != "goodput -":
            text.append("\n" + info.goodput, style="dim")
        self.update(text)
