"""What each preset did in this run, read from the run's events: hours run, batches, and
incidents by kind with their measured cost.  Pure: time comes with the events.  The agent's
:mod:`trainctl.agent.preset_feed` feeds it and keeps the result in the preset history
(:mod:`trainctl.store.preset_history`).

An *incident* is what forces a restart: a stall (its kind the last diagnosis of the episode:
deadlock, spin, or hang for any other) or an exit with an error (crash; oom when the trainer
or the kernel said out of memory; nan when the loss had gone NaN), followed by an automatic
restart or the run's failure.  A stall that ends by itself (the next batch comes), a user's
stop or restart and a Slurm suspension are none.  Hours run are an attempt's time from its
start to its exit, less an incident's detection and kill (from the last batch before it):
those are the incident's cost.

The cost of one incident, measured from the events' timestamps:

* detection: the stall's silence (its ``idle_s``: the last batch until it was declared), or
  the last batch until the crash was seen;
* restart: from then until the next attempt started (kill, backoff, launch);
* startup: that attempt's start until its first batch;
* redone: its first batch until it got back past the batch the incident stopped at.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from trainctl.core.events import Event, Exit, Progress, Restart, Stall, StallDiagnosis, Start, State, Warning
from trainctl.core.recovery import FINAL_STATES, USER_RESTART_REASON, RunState

KINDS = ("deadlock", "spin", "hang", "crash", "oom", "nan")
PARTS = ("detection", "restart", "startup", "redone")
_STALL_KINDS = {"deadlock": "deadlock", "spin": "spin"}
_OOM_WORDS = ("out of memory", "outofmemory")


@dataclass
class Tally:
    """One preset's figures in this run (the usage's own; copied out by :meth:`PresetUsage.tallies`)."""

    seconds: float = 0.0
    batches: int = 0
    incidents: dict[str, int] = field(default_factory=dict)
    cost_s: dict[str, float] = field(default_factory=dict)  # summed measured cost per part
    costed: int = 0  # incidents whose whole cost was measured

    def copy(self) -> Tally:
        return Tally(self.seconds, self.batches, dict(self.incidents), dict(self.cost_s), self.costed)


@dataclass
class _Suspected:
    kind: str
    key: tuple[str, str]
    since: float  # the last batch before it (or its attempt's start)
    declared: float  # the stall event (or the exit)
    exit_ts: float | None = None  # when the trainer exited


@dataclass
class _Incident:
    key: tuple[str, str]
    at: float  # when it was declared
    high_water: int  # the furthest batch before it
    parts: dict[str, float]
    start_ts: float | None = None  # the next attempt's start
    first_batch_ts: float | None = None  # that attempt's first batch


class PresetUsage:
    """Feed every journaled event (:meth:`on_event`) and every batch (Progress) in order;
    :meth:`tallies` says what each (preset, content) did, the open attempt counted up to
    ``now``.  ``content_of(preset)``: the hash of what the preset sets, asked at each start."""

    def __init__(self, content_of: Callable[[str | None], str]) -> None:
        self.content_of = content_of
        self._tallies: dict[tuple[str, str], Tally] = {}
        self._key: tuple[str, str] | None = None  # the running attempt's preset
        self._since: float | None = None  # the running attempt's start, while it is at risk
        self._last_ts: float | None = None  # its last batch
        self._g: int | None = None  # its last global batch
        self._high_water = 0
        self._suspected: _Suspected | None = None  # a stall or failed exit, until a restart follows
        self._signs: set[str] = set()  # oom / nan warnings seen in this attempt
        self._open: _Incident | None = None  # an incident whose cost is still being measured

    # ------------------------------------------------------------------ events
    def on_event(self, ev: Event) -> None:
        match ev:
            case Start():
                self._on_start(ev)
            case Progress():
                self._on_progress(ev)
            case Stall():  # silent since idle_s: the detector's own measure of the last batch
                self._suspect(_STALL_KINDS.get(ev.diagnosis, "hang"), ev.ts, ev.ts - ev.idle_s)
            case StallDiagnosis():  # the verdict on the stall said at detection names it
                if self._suspected is not None and ev.diagnosis in _STALL_KINDS:
                    self._suspected.kind = _STALL_KINDS[ev.diagnosis]
            case Warning():
                if ev.id == "kernel.oom_kill" or "out_of_memory" in ev.id or ev.id.endswith(".oom"):
                    self._signs.add("oom")
                elif ev.id == "loss.nan":
                    self._signs.add("nan")
            case Exit():
                self._close_hours(ev.ts)
                if self._suspected is None and (ev.returncode not in (0, None) or ev.signal):
                    self._suspect(self._crash_kind(ev), ev.ts)
                if self._suspected is not None:
                    self._suspected.exit_ts = ev.ts
            case Restart():
                if ev.reason != USER_RESTART_REASON and "suspend" not in ev.reason:
                    self._incident()
                self._suspected = None
            case State():
                if ev.state == RunState.FAILED:
                    self._incident()
                if ev.state in FINAL_STATES:
                    self._suspected = None

    def _on_start(self, ev: Start) -> None:
        self._close_hours(ev.ts)
        self._key = (ev.preset or "", self.content_of(ev.preset))
        self._since, self._last_ts, self._g = ev.ts, None, None
        self._suspected, self._signs = None, set()
        if self._open is not None and self._open.start_ts is None:
            self._open.parts["restart"] = max(0.0, ev.ts - self._open.at)
            self._open.start_ts = ev.ts

    def _on_progress(self, ev: Progress) -> None:
        if ev.rank not in (None, 0) or ev.batch is None or self._key is None:
            return
        g = ((ev.epoch or 1) - 1) * (ev.batches or 0) + ev.batch
        tally = self._tally(self._key)
        if self._g is not None and g > self._g:
            tally.batches += g - self._g
            if self._suspected is not None and self._suspected.exit_ts is None:
                self._suspected = None  # the stall ended by itself: no restart, no incident
        elif self._g is None:
            tally.batches += 1
        self._g, self._last_ts = g, ev.ts
        inc = self._open
        if inc is not None and inc.start_ts is not None:
            if inc.first_batch_ts is None:
                inc.first_batch_ts = ev.ts
                inc.parts["startup"] = max(0.0, ev.ts - inc.start_ts)
            if g >= inc.high_water:
                inc.parts["redone"] = max(0.0, ev.ts - inc.first_batch_ts)
                self._close_incident(inc)
        self._high_water = max(self._high_water, g)

    # ------------------------------------------------------------------ incidents
    def _crash_kind(self, ev: Exit) -> str:
        said = (ev.exception or "").lower()
        if "oom" in self._signs or any(w in said for w in _OOM_WORDS):
            return "oom"
        if "nan" in self._signs:
            return "nan"
        return "crash"

    def _suspect(self, kind: str, ts: float, silent_since: float | None = None) -> None:
        """A stall or an exit with an error: an incident once a restart (or the run's
        failure) follows; the first stall of an episode dates it, the last one names it."""
        if self._key is None:
            return
        if self._suspected is not None:
            self._suspected.kind = kind
            return
        since = silent_since if silent_since is not None else self._last_ts
        since = since if since is not None else self._since
        if self._since is not None:
            since = max(since if since is not None else ts, self._since)
        self._suspected = _Suspected(kind, self._key, since if since is not None else ts, ts)

    def _incident(self) -> None:
        """The suspected incident forced a restart: count it, open its cost, and take its
        detection and kill out of the hours run."""
        sus, self._suspected = self._suspected, None
        if sus is None:
            return
        if self._open is not None:  # a new incident before the last one was paid back
            self._close_incident(self._open, measured=False)
        tally = self._tally(sus.key)
        tally.incidents[sus.kind] = tally.incidents.get(sus.kind, 0) + 1
        end = sus.exit_ts if sus.exit_ts is not None else sus.declared
        tally.seconds = max(0.0, tally.seconds - max(0.0, end - sus.since))
        self._open = _Incident(
            sus.key, sus.declared, self._high_water, {"detection": sus.declared - sus.since}
        )

    def _close_incident(self, inc: _Incident, measured: bool = True) -> None:
        """Add a paid-back incident's cost; one cut short (another incident, the run's end)
        is counted but not costed: a part of a cost would bias the mean down."""
        if measured:
            tally = self._tally(inc.key)
            for part, s in inc.parts.items():
                tally.cost_s[part] = tally.cost_s.get(part, 0.0) + s
            tally.costed += 1
        self._open = None

    # ------------------------------------------------------------------ hours
    def _close_hours(self, ts: float) -> None:
        if self._key is not None and self._since is not None:
            self._tally(self._key).seconds += max(0.0, ts - self._since)
        self._since = None

    def _tally(self, key: tuple[str, str]) -> Tally:
        return self._tallies.setdefault(key, Tally())

    @property
    def paying_back(self) -> bool:
        """An incident's cost is still being measured (its work not yet redone)."""
        return self._open is not None

    def tallies(self, now: float) -> dict[tuple[str, str], Tally]:
        """(preset, content) -> a copy of its tally, the running attempt counted up to ``now``."""
        out = {k: t.copy() for k, t in self._tallies.items()}
        if self._key is not None and self._since is not None:
            out.setdefault(self._key, Tally()).seconds += max(0.0, now - self._since)
        return out
