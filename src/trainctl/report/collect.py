"""What a run report holds, read from a run directory without disturbing its agent.

The losses and the goodput come from the run's view (:func:`trainctl.store.snapshot.load_view`:
its snapshot and the journal after it, never written from here: the agent owns it); the
rest (attempts, incidents, checkpoints, the projection over time) from one pass over the
journal up to the byte the view covers, in which the progress lines (the bulk of a long
run) are not decoded, only looked at for their time.  The journal is only read: a live run
goes on writing it, and a torn last line (a write under way, an agent killed mid-write) is
where the reading stops.
"""

from __future__ import annotations

import bisect
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainctl.client.connection import agent_holds
from trainctl.core import events as E
from trainctl.core.recovery import FINAL_STATES
from trainctl.core.resumed import resumed
from trainctl.core.sanitize import sanitize
from trainctl.core.series import lttb
from trainctl.store.snapshot import load_view

CHART_POINTS = 600  # points per drawn line
TABLE_KEEP = 200  # rows kept per table (the newest); the count of the others is said
_PROGRESS = b'"type":"progress"'
_WANTED = frozenset(
    {"start", "restart", "stall", "stall_diagnosis", "exit", "state", "checkpoint", "projection"}
)


@dataclass
class Incident:
    ts: float
    kind: str  # stall | exit
    attempt: int | None
    text: str
    since: float | None = None  # the last batch before it (when the hang began)
    cost_s: float | None = None  # from the last batch before it to the first one after


@dataclass
class Report:
    """Everything the renderers draw; every text sanitised (no escape sequences) but not
    yet escaped for HTML."""

    run_dir: str
    job: str
    state: str = "UNKNOWN"
    state_reason: str = ""
    live: bool = False  # no final state in the journal yet
    started: float | None = None
    last_ts: float | None = None
    ended: float | None = None  # the final state's time
    losses: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)  # name -> (ts, value)
    rate: tuple[list[float], list[float]] = ([], [])  # (ts, batches/s) from the projections
    eta: tuple[list[float], list[float]] = ([], [])  # (ts, projected end)
    deadline: float | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)  # table -> rows left out
    goodput: dict[str, Any] = field(default_factory=dict)
    events: int = 0
    read_s: float = 0.0


def _keep(rows: list, name: str, dropped: dict[str, int]) -> None:
    if len(rows) > TABLE_KEEP:
        dropped[name] = dropped.get(name, 0) + len(rows) - TABLE_KEEP
        del rows[:-TABLE_KEEP]


def sampled(xs: list[float], ys: list[float], points: int = CHART_POINTS) -> tuple[list[float], list[float]]:
    keep = lttb(xs, ys, points)
    return [xs[i] for i in keep], [ys[i] for i in keep]


def _loss_lines(view) -> dict[str, tuple[list[float], list[float]]]:
    """Each loss over time: the view's whole-run history, then its newest points (LTTB)."""
    out = {}
    for name, s in view.losses.items():
        cut = bisect.bisect_left(s.xs, s.rxs[0]) if s.rxs else len(s.xs)
        ts, ys = s.ts[:cut] + s.rts, s.ys[:cut] + s.rys
        order = sorted(range(len(ts)), key=ts.__getitem__)  # restarts redo batches: by time
        out[sanitize(name)] = sampled([ts[i] for i in order], [ys[i] for i in order])
    return out


def _progress_ts(line: bytes) -> float | None:
    """A progress line's time, read without decoding the line (``{"ts":123.4,...``)."""
    try:
        ts = float(line[6 : line.index(b",", 6)])
    except ValueError:
        return None
    return ts if math.isfinite(ts) and ts >= 0 else None  # "1e999" reads as inf: no time


class _Pass:
    """The one pass over the journal: the events the tables need."""

    def __init__(self, out: Report) -> None:
        self.out = out
        self.attempt: int | None = None
        self.last_batch: float | None = None  # the last progress line's time (read when wanted)
        self.last_line: bytes | None = None  # the last progress line
        self.open: list[Incident] = []  # incidents waiting for the next batch (their cost)
        self.hang_seen = False
        self.rate_ts: list[float] = []
        self.rate: list[float] = []
        self.eta_ts: list[float] = []
        self.eta: list[float] = []

    def progress(self, ts: float) -> None:
        """The first batch after open incidents: their cost ends here."""
        self.hang_seen = False
        for inc in self.open:
            if inc.since is not None:
                inc.cost_s = ts - inc.since
        self.open = []

    def event(self, e: E.Event) -> None:
        out = self.out
        if isinstance(e, E.Start):
            self.attempt = e.attempt
            out.attempts.append(
                {"attempt": e.attempt, "ts": e.ts, "preset": e.preset, "slurm_job": e.slurm_job, "reason": ""}
            )
        elif isinstance(e, E.Restart):
            out.attempts.append(
                {
                    "attempt": e.attempt,
                    "ts": e.ts,
                    "preset": e.preset,
                    "slurm_job": None,
                    "reason": e.reason,
                    "resume_from": e.resume_from,
                    "resumed": resumed(e),
                    "restart": True,
                }
            )
        elif isinstance(e, E.Stall) or (isinstance(e, E.State) and e.state == "STALLED"):
            self._hang(e)
        elif isinstance(e, E.StallDiagnosis):
            self._verdict(e)
        elif isinstance(e, E.Exit) and (e.returncode not in (0, None) or e.signal):
            if not self.hang_seen:  # a kill after a stall is the stall's
                text = e.exception or f"exit {e.returncode} {e.signal or ''}".strip()
                self._incident(Incident(e.ts, "exit", self.attempt, text, self.last_batch))
        elif isinstance(e, E.State):
            out.state, out.state_reason = e.state, e.reason
            if e.state in FINAL_STATES:
                out.ended = e.ts
        elif isinstance(e, E.Checkpoint):
            out.checkpoints.append(
                {"ts": e.ts, "epoch": e.epoch, "batch": e.batch, "kind": e.kind, "ok": e.ok, "path": e.path}
            )
        elif isinstance(e, E.Projection):
            self._projection(e)

    def _hang(self, e: E.Event) -> None:
        """A stall event, or the STALLED state before it: one incident per hang, the stall
        event's diagnosis in it whichever came first."""
        if isinstance(e, E.State):
            self.out.state, self.out.state_reason = e.state, e.reason
        last = self.out.incidents[-1] if self.out.incidents else None
        same = last is not None and last.kind == "stall" and last.attempt == self.attempt
        if same and isinstance(e, E.Stall) and (self.hang_seen or e.ts - e.idle_s <= last.ts):  # type: ignore[union-attr]
            last.text = _stall_text(e)  # type: ignore[union-attr]  # its diagnosis, even after a batch came
            return
        if self.hang_seen and same:
            return
        self.hang_seen = True
        text = _stall_text(e) if isinstance(e, E.Stall) else e.reason  # type: ignore[attr-defined]
        self._incident(Incident(e.ts, "stall", self.attempt, text, self.last_batch))

    def _verdict(self, e: E.StallDiagnosis) -> None:
        """The verdict on the stall said at detection: it names that stall's incident."""
        last = self.out.incidents[-1] if self.out.incidents else None
        if last is not None and last.kind == "stall" and last.attempt == self.attempt:
            head = last.text.split(f": {E.DIAGNOSING}")[0]
            last.text = f"{head}: {e.diagnosis}; {e.detail}" if e.detail else f"{head}: {e.diagnosis}"

    def _incident(self, inc: Incident) -> None:
        self.out.incidents.append(inc)
        self.open.append(inc)
        _keep(self.out.incidents, "incidents", self.out.dropped)

    def _projection(self, e: E.Projection) -> None:
        if e.rate is not None and e.rate_source in (None, "measured"):
            self.rate_ts.append(e.ts)
            self.rate.append(float(e.rate))
        if e.eta is not None:
            self.eta_ts.append(e.ts)
            self.eta.append(float(e.eta))
        if e.deadline is not None:
            self.out.deadline = e.deadline


def _stall_text(e: E.Stall) -> str:
    text = f"no batch for {e.idle_s:.0f} s in {e.phase}: {e.diagnosis}"
    return f"{text}; {e.detail}" if e.detail else text


def _job_name(run_dir: Path) -> str:
    try:
        spec = json.loads((run_dir / "spec.json").read_text())
        return str(spec.get("job_name") or run_dir.name)
    except (OSError, ValueError, AttributeError):
        return run_dir.name


def collect(run_dir: Path | str, now: float | None = None) -> Report:
    """The report of the run in ``run_dir`` (FileNotFoundError when it has no journal)."""
    t0 = time.perf_counter()
    run_dir = Path(run_dir)
    journal = run_dir / "events.jsonl"
    if not journal.is_file():
        raise FileNotFoundError(f"{run_dir}: no events.jsonl (not a trainctl run directory)")
    live_agent = agent_holds(run_dir)
    covered = load_view(run_dir, write=False if live_agent else None)  # the agent owns its snapshot
    out = Report(str(run_dir), sanitize(_job_name(run_dir)))
    one = _Pass(out)
    _read(journal, covered.offset, one, out)
    for inc in out.incidents:
        inc.text = sanitize(inc.text)
    for a in out.attempts:
        a["reason"], a["preset"] = sanitize(str(a["reason"])), sanitize(str(a["preset"] or "-"))
    for c in out.checkpoints:
        c["path"], c["kind"] = sanitize(str(c["path"])), sanitize(str(c["kind"]))
    out.state, out.state_reason = sanitize(out.state), sanitize(out.state_reason)
    out.live = out.ended is None
    out.losses = _loss_lines(covered.view)
    out.rate = sampled(one.rate_ts, one.rate)
    out.eta = sampled(one.eta_ts, one.eta)
    out.goodput = covered.view.goodput.totals(
        (now if now is not None else time.time()) if out.live and live_agent else None
    )
    out.read_s = time.perf_counter() - t0
    return out


def _read(journal: Path, upto: int, one: _Pass, out: Report) -> None:
    """The journal's lines up to byte ``upto`` (what the view covers), progress by its time
    only, the others decoded when the tables want them."""
    from trainctl.store.journal import JournalReader, raw_lines

    reader, seq = JournalReader(), 0
    with open(journal, "rb") as f:
        for line, done in raw_lines(f):
            if done > upto:
                break
            seq += 1
            if line is None:  # too long to read: unreadable
                reader.unreadable += 1
                continue
            raw = line
            if out.started is None:
                out.started = _progress_ts(raw) or None
            if _PROGRESS in raw:  # the bulk: its time read only when an incident waits for it
                one.last_line = raw
                if one.open and (ts := _progress_ts(raw)) is not None:
                    one.progress(ts)
                continue
            e = reader.event(raw, seq - 1)
            if e is None:
                continue
            out.last_ts = e.ts
            if e.type in _WANTED:
                one.last_batch = _progress_ts(one.last_line) if one.last_line is not None else None
                one.event(e)
    out.events = seq
    if one.last_line is not None:
        out.last_ts = max(out.last_ts or 0.0, _progress_ts(one.last_line) or 0.0)
    _keep(out.attempts, "attempts", out.dropped)
    _keep(out.checkpoints, "checkpoints", out.dropped)
