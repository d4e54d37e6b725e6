"""What the dashboard knows about the run, rebuilt from events (no Textual here).

:class:`RunModel` folds journal events into plain state: the loss series over the global
batch index, restart marks, warnings counted by id, the latest progress, stall and
projection.  Applying half a million replayed events is a tight loop with no drawing;
the screen then pushes the result down to its widgets once per batch.

Every text that came from the agent (and so possibly from the trainer: console lines,
side-channel events, a remote or older agent) is sanitised here, once, before any widget
shows it (:func:`trainctl.engine.sanitize.sanitize`: no control, no escape sequence);
widgets that render markup escape it as well.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from trainctl.engine import events as ev
from trainctl.engine.sanitize import sanitize

LOG_KEEP = 500          # raw log lines kept for the log tail
CHART_POINTS = 400      # points per loss series drawn on the chart


@dataclass
class WarningRow:
    """One warning id as the panel shows it: newest occurrence, counted."""

    id: str
    severity: str
    text: str
    advice: str
    source: str
    count: int
    ts: float


@dataclass
class Series:
    """One loss over the global batch index (finite values only)."""

    xs: list[float] = field(default_factory=list)
    ys: list[float] = field(default_factory=list)

    def sampled(self, points: int = CHART_POINTS) -> tuple[list[float], list[float]]:
        """At most about ``points`` evenly strided points, always ending on the last."""
        n = len(self.xs)
        if n <= points:
            return list(self.xs), list(self.ys)
        step = math.ceil(n / points)
        xs, ys = self.xs[::step], self.ys[::step]
        if (n - 1) % step:
            xs.append(self.xs[-1])
            ys.append(self.ys[-1])
        return xs, ys


@dataclass
class RankRow:
    """One torchrun rank as the dashboard shows it: its last batch and its rate."""

    rank: int
    epoch: int | None = None
    epochs: int | None = None
    batch: int | None = None
    batches: int | None = None
    rate: float | None = None     # batches per second between its last two journaled batches
    ts: float | None = None
    x: float | None = None        # its global batch index at ts


class RunModel:
    """The run's state as seen through its events; ``version`` bumps on every change."""

    def __init__(self) -> None:
        self.job = ""
        self.host = ""
        self.run_dir = ""
        self.preset: str | None = None
        self.fallback: str | None = None
        self.auto_recover = True
        self.state = "STARTING"
        self.state_reason = ""
        self.attempt: int | None = None
        self.phase: str | None = None
        self.progress: ev.Progress | None = None
        self.epoch_started: float | None = None
        self.last_progress_ts: float | None = None
        self.x = 0.0
        self.losses: dict[str, Series] = {}
        self.restarts: list[tuple[float, str]] = []
        self.warnings: dict[str, WarningRow] = {}
        self.stall: ev.Stall | None = None
        self.projection: ev.Projection | None = None
        self.exit: ev.Exit | None = None
        self.tick: ev.Tick | None = None
        self.ranks: dict[int, RankRow] = {}   # torchrun: a row per rank (this attempt)
        self.lead_rank: int | None = None     # the lowest rank: its progress drives the chart
        self.stuck_ranks: tuple[int, ...] = ()   # the culprits of this attempt's stall
        self.log: deque[str] = deque(maxlen=LOG_KEEP)
        self.last_seq = -1
        self.events_seen = 0
        self.version = 0            # any change
        self.chart_version = 0      # losses or restarts changed
        self.warnings_version = 0   # warning rows changed

    # ------------------------------------------------------------------ input
    def apply_hello(self, hello: dict[str, Any]) -> None:
        """Take the agent's hello: job, host, run dir, presets and current state."""
        self.job = sanitize(str(hello.get("job") or self.job))
        self.host = sanitize(str(hello.get("host") or self.host))
        self.run_dir = str(hello.get("run_dir") or self.run_dir)   # a path, used as one
        self.preset = hello.get("preset") or self.preset
        self.fallback = hello.get("fallback") or self.fallback
        if hello.get("auto_recover") is not None:
            self.auto_recover = bool(hello["auto_recover"])
        if hello.get("state"):
            self.state = sanitize(str(hello["state"]))
        self.version += 1

    def apply_all(self, events: tuple[ev.Event, ...] | list[ev.Event]) -> None:
        """Fold journal events in order (the hot path of a replay)."""
        handlers = self._handlers
        for event in events:
            handler = handlers.get(event.type)
            if handler is not None:
                handler(self, event)
            if event.seq is not None:
                self.last_seq = event.seq
        self.events_seen += len(events)
        if events:
            self.version += 1

    def apply_tick(self, tick: ev.Tick) -> None:
        self.tick = tick
        self.auto_recover = tick.auto_recover
        if tick.phase:
            self.phase = tick.phase
        self.version += 1

    def apply_log(self, lines: tuple[str, ...]) -> tuple[str, ...]:
        """Keep the raw log lines (sanitised); returns them as kept, for the log view."""
        lines = tuple(sanitize(line) for line in lines)
        self.log.extend(lines)
        return lines

    # ------------------------------------------------------------------ events
    def _on_start(self, e: ev.Start) -> None:
        self.attempt = e.attempt
        self.preset = e.preset or self.preset
        self.exit = None
        self.ranks, self.lead_rank, self.stuck_ranks = {}, None, ()

    def _on_phase(self, e: ev.Phase) -> None:
        self.phase = e.phase

    def _on_rank(self, e: ev.Progress) -> bool:
        """Update the rank's row; whether this rank leads (the chart follows one rank)."""
        rank = e.rank
        row = self.ranks.get(rank)
        if row is None:
            row = self.ranks[rank] = RankRow(rank)
        x = (e.epoch - 1) * e.batches + e.batch if e.epoch and e.batches and e.batch is not None else None
        if x is not None and row.x is not None and row.ts is not None and e.ts > row.ts and x >= row.x:
            row.rate = (x - row.x) / (e.ts - row.ts)
        row.epoch, row.epochs, row.batch, row.batches, row.ts, row.x = (
            e.epoch, e.epochs, e.batch, e.batches, e.ts, x)
        if self.lead_rank is None or rank < self.lead_rank:
            self.lead_rank = rank
        return rank == self.lead_rank

    def _on_progress(self, e: ev.Progress) -> None:
        if e.rank is not None and not self._on_rank(e):
            return
        prev = self.progress
        if e.epoch is not None and e.batches and e.batch is not None:
            self.x = float((e.epoch - 1) * e.batches + e.batch)
        else:
            self.x += 1.0
        if prev is None or prev.epoch != e.epoch:
            self.epoch_started = e.ts
        self.progress = e
        self.last_progress_ts = e.ts
        x = self.x
        for name, value in e.losses.items():
            if value is None or not math.isfinite(value):
                continue
            series = self.losses.get(name)
            if series is None:
                if not name.isprintable():
                    name = sanitize(name)   # a legend label; the trainer named it
                    series = self.losses.get(name)
                if series is None:
                    series = self.losses[name] = Series()
            series.xs.append(x)
            series.ys.append(value)
        self.chart_version += 1

    def _on_warning(self, e: ev.Warning) -> None:
        key = sanitize(e.id)
        row = self.warnings.pop(key, None)
        count = e.count if row is None else max(e.count, row.count + 1)
        self.warnings[key] = WarningRow(key, sanitize(e.severity), sanitize(e.text),
                                        sanitize(e.advice), sanitize(e.source), count, e.ts)
        self.warnings_version += 1

    def note(self, key: str, severity: str, text: str, advice: str, ts: float) -> None:
        """A row in the warnings panel for something trainctl itself reports."""
        self._on_warning(ev.Warning(ts, id=key, severity=severity, text=text, advice=advice,
                                    source="trainctl"))

    def _on_stall(self, e: ev.Stall) -> None:
        self.stall = e
        self.stuck_ranks = tuple(e.ranks)
        advice = "; ".join(part for part in (e.detail, f"stacks: {e.stacks}" if e.stacks else "")
                           if part)
        self.note(f"stall.{e.diagnosis}", "error",
                  f"no batch for {e.idle_s:.0f} s in {e.phase}: {e.diagnosis}", advice, e.ts)

    def _on_restart(self, e: ev.Restart) -> None:
        self.restarts.append((self.x, sanitize(f"#{e.attempt} {e.preset or ''}".strip())))
        self.preset = e.preset or self.preset
        self.chart_version += 1

    def _on_exit(self, e: ev.Exit) -> None:
        self.exit = e
        if e.exception:   # the traceback's tail, in the warnings panel
            self.note("trainer.exception", "error", e.exception,
                      " | ".join(e.traceback[:-1]) if e.traceback else "", e.ts)

    def _on_projection(self, e: ev.Projection) -> None:
        self.projection = e

    def _on_state(self, e: ev.State) -> None:
        self.state = sanitize(e.state)
        self.state_reason = sanitize(e.reason)

    def _on_checkpoint(self, e: ev.Checkpoint) -> None:
        if not e.ok:
            self.note("checkpoint.bad", "warning", f"checkpoint not usable: {e.path}",
                       e.detail, e.ts)

    def _on_info(self, e: ev.Info) -> None:
        self.note(e.key or "trainctl.info", "info", e.text, "", e.ts)

    _handlers: dict[str, Any] = {
        "start": _on_start, "phase": _on_phase, "progress": _on_progress,
        "warning": _on_warning, "stall": _on_stall, "restart": _on_restart, "exit": _on_exit,
        "projection": _on_projection, "state": _on_state, "checkpoint": _on_checkpoint,
        "info": _on_info,
    }

    # ------------------------------------------------------------------ views
    def warning_rows(self) -> list[WarningRow]:
        """Newest first."""
        return list(reversed(self.warnings.values()))

    def rank_rows(self) -> tuple[RankRow, ...]:
        return tuple(self.ranks[r] for r in sorted(self.ranks))

    def chart_points(self) -> int:
        """How many loss values the model holds (all series together)."""
        return sum(len(s.xs) for s in self.losses.values())
