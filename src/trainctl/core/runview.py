"""What a client shows of a run, folded from its journal events (no Textual, no files here).

:class:`RunView` is the one model of "what a client shows": the dashboard's model is a
RunView (plus the live tick and log lines), ``trainctl status`` reads one, and the agent's
snapshots (:mod:`trainctl.store.snapshot`) are one written down.  It folds journal events
into plain state: state, attempt, preset, the latest progress, warnings counted by id,
incidents (stalls, restarts, failed exits), the projection, and each loss over the global
batch index.

Each loss is a :class:`~trainctl.core.series.Series`: the whole run in bounded memory
(downsampled with LTTB, restart and incident marks kept) plus the newest points at full
resolution.  The fold is deterministic: a RunView restored from :meth:`RunView.to_dict` and
fed the events after it equals one fed every event (what makes snapshots safe).

Every text that came from the agent (and so possibly from the trainer) is sanitised here,
once, before any widget shows it (:func:`trainctl.core.sanitize.sanitize`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, cast

from trainctl.core import events as ev
from trainctl.core.goodput import Goodput
from trainctl.core.resumed import resumed, resumed_phrase
from trainctl.core.sanitize import sanitize
from trainctl.core.series import CHART_POINTS, Series

VIEW_FORMAT = 1
MARKS_KEEP = 2000  # restart marks kept (the newest)
INCIDENTS_KEEP = 200  # incidents kept (the newest)
WARNINGS_KEEP = 500  # warning ids kept (the newest)
RANGES = ("run", "hour", "epoch")  # what the chart shows: the whole run, the last hour, the last epoch


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
class RankRow:
    """One torchrun rank as the dashboard shows it: its last batch and its rate."""

    rank: int
    epoch: int | None = None
    epochs: int | None = None
    batch: int | None = None
    batches: int | None = None
    rate: float | None = None  # batches per second between its last two journaled batches
    ts: float | None = None
    x: float | None = None  # its global batch index at ts


class RunView:
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
        self.env: tuple[str, ...] = ()  # the names of the attempt's trainer's environment
        self.phase: str | None = None
        self.progress: ev.Progress | None = None
        self.epoch_started: float | None = None
        self.last_progress_ts: float | None = None
        self.x = 0.0
        self.losses: dict[str, Series] = {}
        self.restarts: list[tuple[float, str]] = []
        self.incidents: list[dict[str, Any]] = []  # {ts, x, kind, text}: stalls, restarts, failed exits
        self.warnings: dict[str, WarningRow] = {}
        self.stall: ev.Stall | None = None
        self.projection: ev.Projection | None = None
        self.exit: ev.Exit | None = None
        self.ranks: dict[int, RankRow] = {}  # torchrun: a row per rank (this attempt)
        self.lead_rank: int | None = None  # the lowest rank: its progress drives the chart
        self.stuck_ranks: tuple[int, ...] = ()  # the stall's culprits (none known: its stalled ranks)
        self.save_dir: str | None = None  # where the library writes its results (Ultralytics)
        self.resumed: dict[str, Any] | None = None  # the last restart's resume (core/resumed.py)
        self.goodput = Goodput()  # the wall time by bucket (core/goodput.py)
        self.last_seq = -1
        self.events_seen = 0
        self.unreadable = 0  # journal lines skipped by the one who folds: not a whole, well-typed event
        self.version = 0  # any change
        self.chart_version = 0  # losses or restarts changed
        self.warnings_version = 0  # warning rows changed

    # ------------------------------------------------------------------ input
    def apply_hello(self, hello: dict[str, Any]) -> None:
        """Take the agent's hello: job, host, run dir, presets and current state."""
        self.job = sanitize(str(hello.get("job") or self.job))
        self.host = sanitize(str(hello.get("host") or self.host))
        self.run_dir = str(hello.get("run_dir") or self.run_dir)  # a path, used as one
        self.preset = hello.get("preset") or self.preset
        self.fallback = hello.get("fallback") or self.fallback
        if hello.get("auto_recover") is not None:
            self.auto_recover = bool(hello["auto_recover"])
        if hello.get("state"):
            self.state = sanitize(str(hello["state"]))
        self.version += 1

    def apply_all(self, events: tuple[ev.Event, ...] | list[ev.Event]) -> None:
        """Fold journal events in order (the hot path of a replay)."""
        handlers, goodput = self._handlers, self.goodput.apply
        for event in events:
            if event.type not in ev.EPHEMERAL:
                goodput(event)
            handler = handlers.get(event.type)
            if handler is not None:
                handler(self, event)
            if event.seq is not None:
                self.last_seq = event.seq
        self.events_seen += len(events)
        if events:
            self.version += 1

    def apply(self, event: ev.Event) -> None:
        """Fold one journal event."""
        if event.type not in ev.EPHEMERAL:
            self.goodput.apply(event)
        handler = self._handlers.get(event.type)
        if handler is not None:
            handler(self, event)
        if event.seq is not None:
            self.last_seq = event.seq
        self.events_seen += 1
        self.version += 1

    # ------------------------------------------------------------------ events
    def _on_start(self, e: ev.Start) -> None:
        self.attempt = e.attempt
        self.env = e.env
        self.preset = e.preset or self.preset
        self.exit = None
        self.ranks, self.lead_rank, self.stuck_ranks = {}, None, ()

    def _on_phase(self, e: ev.Phase) -> None:
        self.phase = e.phase

    def _on_rank(self, e: ev.Progress) -> bool:
        """Update the rank's row; whether this rank leads (the chart follows one rank)."""
        rank = cast(int, e.rank)  # called for a progress with a rank
        row = self.ranks.get(rank)
        if row is None:
            row = self.ranks[rank] = RankRow(rank)
        x = (e.epoch - 1) * e.batches + e.batch if e.epoch and e.batches and e.batch is not None else None
        if x is not None and row.x is not None and row.ts is not None and e.ts > row.ts and x >= row.x:
            row.rate = (x - row.x) / (e.ts - row.ts)
        row.epoch, row.epochs, row.batch, row.batches, row.ts, row.x = (
            e.epoch,
            e.epochs,
            e.batch,
            e.batches,
            e.ts,
            x,
        )
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
        self.progress = ev.merged_progress(prev, e)  # a loss-only line keeps the counter
        self.last_progress_ts = e.ts
        x = self.x
        for name, value in e.losses.items():
            if value is None or not math.isfinite(value):
                continue
            series = self.losses.get(name)
            if series is None:
                if not name.isprintable():
                    name = sanitize(name)  # a legend label; the trainer named it
                    series = self.losses.get(name)
                if series is None:
                    series = self.losses[name] = Series()
            series.add(x, value, e.ts, self.marks)
        self.chart_version += 1

    def marks(self) -> list[float]:
        """The x of every restart and incident kept (the downsampling keeps their points)."""
        return sorted({x for x, _ in self.restarts} | {i["x"] for i in self.incidents})

    def _incident(self, ts: float, kind: str, text: str) -> None:
        self.incidents.append({"ts": ts, "x": self.x, "kind": kind, "text": text})
        if len(self.incidents) > INCIDENTS_KEEP:
            del self.incidents[:-INCIDENTS_KEEP]

    def _on_warning(self, e: ev.Warning) -> None:
        key = sanitize(e.id)
        row = self.warnings.pop(key, None)
        count = e.count if row is None else max(e.count, row.count + 1)
        self.warnings[key] = WarningRow(
            key, sanitize(e.severity), sanitize(e.text), sanitize(e.advice), sanitize(e.source), count, e.ts
        )
        if len(self.warnings) > WARNINGS_KEEP:
            del self.warnings[next(iter(self.warnings))]
        self.warnings_version += 1

    def note(self, key: str, severity: str, text: str, advice: str, ts: float) -> None:
        """A row in the warnings panel for something trainctl itself reports."""
        self._on_warning(
            ev.Warning(ts, id=key, severity=severity, text=text, advice=advice, source="trainctl")
        )

    def _on_stall(self, e: ev.Stall) -> None:
        self.stall = e
        self.stuck_ranks = tuple(e.ranks)
        text = f"no batch for {e.idle_s:.0f} s in {e.phase}: {e.diagnosis}"
        if e.diagnosis != ev.DIAGNOSING:  # an older journal's stall, its verdict in it
            self._note_verdict(e, text)
        self._incident(e.ts, "stall", sanitize(text))

    def _on_stall_diagnosis(self, e: ev.StallDiagnosis) -> None:
        """The verdict on the stall announced at detection: the stall now carries it."""
        if self.stall is None:
            return
        self.stall = replace(
            self.stall, diagnosis=e.diagnosis, cpu_percent=e.cpu_percent, stacks=e.stacks, detail=e.detail
        )
        if e.culprits:
            self.stuck_ranks = tuple(e.culprits)
        s = self.stall
        self._note_verdict(s, f"no batch for {s.idle_s:.0f} s in {s.phase}: {s.diagnosis}")

    def _note_verdict(self, e: ev.Stall, text: str) -> None:
        advice = "; ".join(part for part in (e.detail, f"stacks: {e.stacks}" if e.stacks else "") if part)
        self.note(f"stall.{e.diagnosis}", "error", text, advice, e.ts)

    def _on_restart(self, e: ev.Restart) -> None:
        label = sanitize(f"#{e.attempt} {e.preset or ''}".strip())
        self.restarts.append((self.x, label))
        if len(self.restarts) > MARKS_KEEP:
            del self.restarts[:-MARKS_KEEP]
        self.resumed = resumed(e)
        frm = f"; {resumed_phrase(self.resumed)}" if e.resume_from else ""
        self._incident(e.ts, "restart", sanitize(f"{label}: {e.reason}{frm}"))
        self.preset = e.preset or self.preset
        self.chart_version += 1

    def _on_exit(self, e: ev.Exit) -> None:
        self.exit = e
        if e.returncode not in (0, None) or e.signal:
            self._incident(
                e.ts, "exit", sanitize(e.exception or f"exit {e.returncode} {e.signal or ''}".strip())
            )
        if e.exception:  # the traceback's tail, in the warnings panel
            self.note(
                "trainer.exception",
                "error",
                e.exception,
                " | ".join(e.traceback[:-1]) if e.traceback else "",
                e.ts,
            )

    def _on_projection(self, e: ev.Projection) -> None:
        self.projection = e

    def _on_state(self, e: ev.State) -> None:
        self.state = sanitize(e.state)
        self.state_reason = sanitize(e.reason)

    def _on_checkpoint(self, e: ev.Checkpoint) -> None:
        if not e.ok:
            self.note("checkpoint.bad", "warning", f"checkpoint not usable: {e.path}", e.detail, e.ts)

    def _on_info(self, e: ev.Info) -> None:
        if (path := ev.results_path(e)) is not None:  # shown as the run's, not a note
            self.save_dir = path
            return
        self.note(e.key or "trainctl.info", "info", e.text, "", e.ts)

    _handlers: dict[str, Any] = {
        "start": _on_start,
        "phase": _on_phase,
        "progress": _on_progress,
        "warning": _on_warning,
        "stall": _on_stall,
        "stall_diagnosis": _on_stall_diagnosis,
        "restart": _on_restart,
        "exit": _on_exit,
        "projection": _on_projection,
        "state": _on_state,
        "checkpoint": _on_checkpoint,
        "info": _on_info,
    }

    # ------------------------------------------------------------------ views
    def rank_rows(self) -> tuple[RankRow, ...]:
        return tuple(self.ranks[r] for r in sorted(self.ranks))

    def warning_rows(self) -> list[WarningRow]:
        """Newest first."""
        return list(reversed(self.warnings.values()))

    def chart_points(self) -> int:
        """How many loss values the model holds (all series together)."""
        return sum(max(len(s.xs), len(s.rxs)) for s in self.losses.values())

    def chart(
        self, span: str = "run", now: float | None = None, points: int = CHART_POINTS
    ) -> tuple[tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...], tuple[tuple[float, str], ...]]:
        """The chart's series (name, xs, ys), downsampled, and the restart marks in range:
        ``span`` is "run" (the whole run), "hour" (the last hour up to ``now``, else up to
        the last progress) or "epoch" (the current epoch)."""
        x_from = t_from = None
        if span == "hour":
            t_from = (now if now is not None else (self.last_progress_ts or 0.0)) - 3600.0
        elif (
            span == "epoch"
            and self.progress is not None
            and self.progress.epoch is not None
            and self.progress.batches
        ):
            x_from = float((self.progress.epoch - 1) * self.progress.batches)
        marks = tuple(self.marks())
        series = []
        for name, s in self.losses.items():
            xs, ys = s.sampled(points, x_from, t_from, marks)
            series.append((name, tuple(xs), tuple(ys)))
        lo = min((xs[0] for _, xs, _ in series if xs), default=None)
        restarts = tuple(r for r in self.restarts if lo is None or span == "run" or r[0] >= lo)
        return tuple(series), restarts

    # ------------------------------------------------------------------ snapshot
    def to_dict(self) -> dict[str, Any]:
        """Everything folded from events so far, as JSON-ready data (:meth:`load_dict` reads
        it back); what only the hello says (job, host, run dir, fallback, auto-recover) is
        not in it."""

        def event(e: ev.Event | None) -> dict[str, Any] | None:
            return None if e is None else ev.to_dict(e)

        return {
            "format": VIEW_FORMAT,
            "preset": self.preset,
            "state": self.state,
            "state_reason": self.state_reason,
            "attempt": self.attempt,
            "env": list(self.env),
            "phase": self.phase,
            "progress": event(self.progress),
            "epoch_started": self.epoch_started,
            "last_progress_ts": self.last_progress_ts,
            "x": self.x,
            "losses": {
                name: [s.xs[:], s.ys[:], s.ts[:], s.rxs[:], s.rys[:], s.rts[:]]
                for name, s in self.losses.items()
            },
            "restarts": [list(r) for r in self.restarts],
            "incidents": [dict(i) for i in self.incidents],
            "warnings": [asdict(w) for w in self.warnings.values()],
            "stall": event(self.stall),
            "projection": event(self.projection),
            "exit": event(self.exit),
            "ranks": [asdict(r) for r in self.rank_rows()],
            "lead_rank": self.lead_rank,
            "stuck_ranks": list(self.stuck_ranks),
            "save_dir": self.save_dir,
            "resumed": self.resumed,
            "goodput": self.goodput.to_dict(),
            "last_seq": self.last_seq,
            "events_seen": self.events_seen,
            "unreadable": self.unreadable,
        }

    def load_dict(self, d: dict[str, Any]) -> None:
        """Take the state of :meth:`to_dict` (ValueError when it is not one: then this view
        may be half taken, so fold into a fresh one)."""
        try:
            self._load(d)
        except (KeyError, TypeError, IndexError, AttributeError) as e:
            raise ValueError(f"not a run view: {type(e).__name__}: {e}") from None
        self.version += 1
        self.chart_version += 1
        self.warnings_version += 1

    def _load(self, d: dict[str, Any]) -> None:
        if d.get("format") != VIEW_FORMAT:
            raise ValueError(f"run view format {d.get('format')!r}, not {VIEW_FORMAT}")

        def event(v: Any, cls: type[ev.Event]) -> Any:
            if v is None:
                return None
            e = ev.from_dict(v)
            if not isinstance(e, cls):
                raise TypeError(f"{e.type} where a {cls.type} was expected")
            return e

        def text(v: Any) -> str:
            return sanitize(str(v))

        def opt(v: Any) -> str | None:
            return None if v is None else text(v)

        def num(v: Any) -> float | None:
            return None if v is None else float(v)

        def floats(v: Any) -> list[float]:
            if not isinstance(v, list):
                raise TypeError("a list of numbers was expected")
            return [float(x) for x in v]

        losses = {}
        for name, parts in dict(d["losses"]).items():
            s = Series(*(floats(p) for p in parts[:6]))
            if not (len(s.xs) == len(s.ys) == len(s.ts) and len(s.rxs) == len(s.rys) == len(s.rts)):
                raise ValueError(f"loss {name!r}: columns of different lengths")
            losses[text(name)] = s
        self.preset = opt(d["preset"])
        self.state, self.state_reason = text(d["state"]), text(d["state_reason"])
        self.attempt = None if d["attempt"] is None else int(d["attempt"])
        self.env = tuple(text(n) for n in d.get("env", ()))  # absent in older snapshots
        self.phase = opt(d["phase"])
        self.progress = event(d["progress"], ev.Progress)
        self.epoch_started, self.last_progress_ts = num(d["epoch_started"]), num(d["last_progress_ts"])
        self.x = float(d["x"])
        self.losses = losses
        self.restarts = [(float(x), text(label)) for x, label in d["restarts"]][-MARKS_KEEP:]
        self.incidents = [
            {"ts": float(i["ts"]), "x": float(i["x"]), "kind": text(i["kind"]), "text": text(i["text"])}
            for i in d["incidents"]
        ][-INCIDENTS_KEEP:]
        self.warnings = {}
        for w in d["warnings"][-WARNINGS_KEEP:]:
            row = WarningRow(
                text(w["id"]),
                text(w["severity"]),
                text(w["text"]),
                text(w["advice"]),
                text(w["source"]),
                int(w["count"]),
                float(w["ts"]),
            )
            self.warnings[row.id] = row
        self.stall = event(d["stall"], ev.Stall)
        self.projection = event(d["projection"], ev.Projection)
        self.exit = event(d["exit"], ev.Exit)
        self.save_dir = opt(d.get("save_dir"))  # absent in snapshots from before it
        was = d.get("resumed")  # likewise
        self.resumed = (
            None
            if was is None
            else {
                text(k): v if isinstance(v, (int, float)) or v is None else text(v)
                for k, v in dict(was).items()
            }
        )
        self.goodput = Goodput()
        self.goodput.load_dict(d["goodput"])  # absent in older snapshots: folded again
        rows = [
            RankRow(
                int(r["rank"]),
                *(
                    None if r[k] is None else (float if k in ("rate", "ts", "x") else int)(r[k])  # type: ignore[arg-type]
                    for k in ("epoch", "epochs", "batch", "batches", "rate", "ts", "x")
                ),
            )
            for r in d.get("ranks", ())
        ]
        self.ranks = {r.rank: r for r in rows}
        self.lead_rank = None if d.get("lead_rank") is None else int(d["lead_rank"])
        self.stuck_ranks = tuple(int(r) for r in d.get("stuck_ranks", ()))
        self.last_seq, self.events_seen = int(d["last_seq"]), int(d["events_seen"])
        self.unreadable = int(d.get("unreadable", 0))

    def state_key(self) -> dict[str, Any]:
        """What two views must agree on to show the same (tests: snapshot + tail == replay)."""
        d = self.to_dict()
        d.pop("events_seen")
        return d


@dataclass(frozen=True)
class ViewSnapshot:
    """What the agent sends a client that asked for a snapshot: a :meth:`RunView.to_dict`
    covering the journal up to ``next_seq`` (exclusive); events from ``next_seq`` follow."""

    view: dict[str, Any]
    next_seq: int
    seq: None = None  # not a journal event (clients that look at ``seq`` skip it)
    type: str = "snapshot"
