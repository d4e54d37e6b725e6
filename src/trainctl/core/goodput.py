"""Goodput: the run's wall time split into productive training and the losses by cause.

:class:`Goodput` folds journal events in order, O(1) per event and in memory.  Every
interval of wall time (from one event's ``ts`` to the next one's) is assigned to exactly one
bucket, the one the run's *mode* at that time names, so the buckets always sum to the wall
time (the first event's ``ts`` to the last one's, or to ``now`` while the run is live).  Two
assignments are made provisionally and moved later, never copied:

- the time since the last sign of life (a progress, a phase or a start) sits in the mode's
  bucket until a hang is detected (a ``STALLED`` state or a ``stall`` event, whichever comes
  first): then it moves to ``detection``;
- the time between two progress events sits in ``productive`` until the later one says
  which batch it ended: a batch at or before the furthest one reached before a restart is
  work redone, and the interval moves to ``redone``; an interval that crosses the furthest
  batch (the journal keeps about one progress a second, so a fast attempt's first journaled
  batches may skip past it) moves the redone batches' share of it.

The events keyed on: ``start`` (start-up, or restart start-up after the first attempt),
``phase`` (train, val, save, startup, finished), ``progress`` (its batch: redone or not),
``state`` (STALLED: detection; STOPPING after a hang: diagnosis and kill; BACKOFF: restart;
PENDING: queue wait; PAUSED: paused; a final state ends the wall time), ``stall``
(detection, when no STALLED came before it), ``stall_diagnosis`` (the verdict: from it until
the STOPPING, awaiting a decision: the user's key with auto-recovery off), ``exit``.  A stall event before or after its
diagnosis, or a diagnosis as an event of its own, gives the same buckets: only the first
sign of the hang counts, and the diagnosis lasts until the kill ends the attempt.
"""

from __future__ import annotations

from typing import Any

from trainctl.core import events as ev

BUCKETS: dict[str, str] = {  # bucket -> what a person reads
    "productive": "productive",
    "startup": "start-up",
    "detection": "detection",
    "diagnosis": "diagnosis and kill",
    "awaiting": "awaiting a decision",
    "restart": "restart start-up",
    "redone": "work redone",
    "checkpoint": "checkpoints",
    "validation": "validation",
    "queue": "queue wait",
    "paused": "paused",
    "ending": "ending",
}
LOSSES = tuple(b for b in BUCKETS if b != "productive")
_PHASE_MODES = {"train": "productive", "val": "validation", "save": "checkpoint", "finished": "ending"}
_NOT_TRAINING = frozenset({"startup", "restart", "diagnosis", "awaiting", "paused", "queue"})
_FINAL = frozenset({"FINISHED", "FAILED", "STOPPED"})
GOODPUT_FORMAT = 2  # 2: the awaiting bucket (an older snapshot is folded again)


class Goodput:
    """The buckets of one run, folded from its journal events (:meth:`apply`)."""

    def __init__(self) -> None:
        self.buckets: dict[str, float] = dict.fromkeys(BUCKETS, 0.0)
        self.mode = "startup"  # the bucket the time from ``last_ts`` on goes to
        self.first_ts: float | None = None
        self.last_ts: float | None = None
        self.pending = 0.0  # time since the last sign of life, in ``pending_in``
        self.pending_in = "startup"
        self.attempts = 0  # starts seen
        self.hang = False  # a hang detected since the last progress or start
        self.closed = False  # a final state: no time after it counts
        self.stopped = False  # ... and it was STOPPED (time after it, if any, is a pause)
        self.furthest = -1.0  # the furthest global batch reached
        self.lead_rank: int | None = None
        self.last_batch: float | None = None  # the last progress's time
        self.last_x: float | None = None  # the last progress's global batch in this attempt

    # ------------------------------------------------------------------ folding
    def apply(self, e: ev.Event) -> None:
        """Fold one journal event (events in journal order)."""
        if self.closed:
            if not (self.stopped and (e.type == "start" or (e.type == "state" and e.state == "STARTING"))):  # type: ignore[attr-defined]
                return  # after the end (a late note): not wall time
            self.closed, self.mode = False, "paused"  # a stopped run goes on: the gap was a pause
        self._advance(e.ts)
        handler = self._handlers.get(e.type)
        if handler is not None:
            handler(self, e)

    def _advance(self, ts: float) -> None:
        if self.first_ts is None:
            self.first_ts = self.last_ts = ts
            return
        dt = ts - self.last_ts if self.last_ts is not None else 0.0
        if dt > 0:  # a clock that steps back adds nothing
            self.buckets[self.mode] += dt
            if self.mode == self.pending_in:
                self.pending += dt
            else:
                self.pending_in, self.pending = self.mode, dt
        self.last_ts = max(ts, self.last_ts or ts)

    def _enter(self, mode: str) -> None:
        """A new mode from now; what was pending stays where it is."""
        self.mode, self.pending_in, self.pending = mode, mode, 0.0

    def _move(self, amount: float, to: str) -> None:
        amount = min(amount, self.buckets[self.pending_in])
        self.buckets[self.pending_in] -= amount
        self.buckets[to] += amount
        self.pending = 0.0

    def _hang_detected(self) -> None:
        if self.hang:
            return
        self.hang = True
        if self.pending_in != "detection":
            self._move(self.pending, "detection")
        self._enter("diagnosis")

    def _on_start(self, e: ev.Start) -> None:
        self.attempts += 1
        self.hang, self.lead_rank, self.last_x = False, None, None
        self._enter("startup" if self.attempts == 1 else "restart")

    def _on_phase(self, e: ev.Phase) -> None:
        if e.phase == "startup":
            self._enter("startup" if self.attempts <= 1 else "restart")
        elif e.phase in _PHASE_MODES:
            self._enter(_PHASE_MODES[e.phase])

    def _on_progress(self, e: ev.Progress) -> None:
        if e.rank is not None:
            if self.lead_rank is not None and e.rank > self.lead_rank:
                return  # the lowest rank's batches are the run's
            self.lead_rank = e.rank
        self.hang, self.last_batch = False, e.ts
        if e.epoch and e.batches and e.batch is not None:
            x = float((e.epoch - 1) * e.batches + e.batch)
            if self.pending_in == "productive":
                if x <= self.furthest:
                    self._move(self.pending, "redone")
                elif self.last_x is not None and self.last_x < self.furthest:  # crossed it
                    self._move(self.pending * (self.furthest - self.last_x) / (x - self.last_x), "redone")
            self.furthest = max(self.furthest, x)
            self.last_x = x
        if self.mode in _NOT_TRAINING:
            self._enter("productive")  # a batch ends them (a trainer that says no train phase)
        else:
            self.pending_in, self.pending = self.mode, 0.0

    def _on_state(self, e: ev.State) -> None:
        s = e.state
        if s in _FINAL:
            self.closed, self.stopped = True, s == "STOPPED"
        elif s == "STALLED":
            self._hang_detected()
        elif s == "STOPPING":
            self._enter("diagnosis" if self.hang else "ending")
        elif s == "BACKOFF":
            self._enter("restart")
        elif s == "PENDING":
            self._enter("queue")
        elif s == "PAUSED":
            self._enter("paused")
        elif s == "STARTING":
            self._enter("startup" if self.attempts == 0 else "restart")
        elif s == "RUNNING" and self.mode in ("diagnosis", "awaiting", "paused"):
            self.hang = False
            self._enter("productive")

    def _on_stall(self, e: ev.Stall) -> None:
        if not self.hang and self.last_batch is not None and e.ts - e.idle_s < self.last_batch:
            return  # the diagnosis of a hang that batches have ended since (its STALLED counted)
        self._hang_detected()

    def _on_verdict(self, e: ev.StallDiagnosis) -> None:
        """The stacks are read: what follows until the attempt is stopped is the wait for a
        decision (with auto-recovery off, the user's key; else the moment to the stop)."""
        if self.hang and self.mode == "diagnosis":
            self._enter("awaiting")

    def _on_exit(self, e: ev.Exit) -> None:
        if e.returncode == 0 and not e.signal:
            self._enter("ending")
        elif not self.hang:
            self._enter("restart")  # a crash: the time to the next start is recovery

    _handlers: dict[str, Any] = {
        "start": _on_start,
        "phase": _on_phase,
        "progress": _on_progress,
        "state": _on_state,
        "stall": _on_stall,
        "stall_diagnosis": _on_verdict,
        "exit": _on_exit,
    }

    # ------------------------------------------------------------------ reading
    def totals(self, now: float | None = None) -> dict[str, Any]:
        """``{wall_s, productive_s, ratio, buckets}`` (seconds by bucket); ``now``: a live
        run's time goes on in its mode up to then (a finished one's does not)."""
        buckets = dict(self.buckets)
        if now is not None and self.last_ts is not None and not self.closed and now > self.last_ts:
            buckets[self.mode] += now - self.last_ts
        wall = sum(buckets.values())
        productive = buckets["productive"]
        return {
            "wall_s": round(wall, 3),
            "productive_s": round(productive, 3),
            "ratio": round(productive / wall, 4) if wall > 0 else None,
            "buckets": {k: round(v, 3) for k, v in buckets.items() if k != "productive"},
        }

    # ------------------------------------------------------------------ snapshot
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": GOODPUT_FORMAT,
            "buckets": dict(self.buckets),
            "mode": self.mode,
            "first_ts": self.first_ts,
            "last_ts": self.last_ts,
            "pending": self.pending,
            "pending_in": self.pending_in,
            "attempts": self.attempts,
            "hang": self.hang,
            "closed": self.closed,
            "stopped": self.stopped,
            "furthest": self.furthest,
            "lead_rank": self.lead_rank,
            "last_batch": self.last_batch,
            "last_x": self.last_x,
        }

    def load_dict(self, d: dict[str, Any]) -> None:
        """Take :meth:`to_dict`'s state (ValueError/TypeError/KeyError when it is not one)."""
        if d.get("format") != GOODPUT_FORMAT:
            raise ValueError(f"goodput format {d.get('format')!r}")
        buckets = {k: float(d["buckets"].get(k, 0.0)) for k in BUCKETS}
        mode, pending_in = str(d["mode"]), str(d["pending_in"])
        if mode not in BUCKETS or pending_in not in BUCKETS:
            raise ValueError(f"goodput mode {mode!r}")

        def num(v: Any) -> float | None:
            return None if v is None else float(v)

        self.buckets, self.mode, self.pending_in = buckets, mode, pending_in
        self.first_ts, self.last_ts, self.pending = num(d["first_ts"]), num(d["last_ts"]), float(d["pending"])
        self.attempts, self.hang = int(d["attempts"]), bool(d["hang"])
        self.closed, self.stopped = bool(d["closed"]), bool(d["stopped"])
        self.furthest = float(d["furthest"])
        self.lead_rank = None if d["lead_rank"] is None else int(d["lead_rank"])
        self.last_batch = num(d["last_batch"])
        self.last_x = num(d.get("last_x"))  # absent in older snapshots: no share moved once


def describe(totals: dict[str, Any], top: int = 4) -> str:
    """One line: ``goodput 93.1 % · lost 41 min: restart start-up 22, detection 9, ...``
    (minutes, or seconds for a run under ten minutes)."""
    ratio, wall = totals.get("ratio"), totals.get("wall_s") or 0.0
    if ratio is None:
        return "goodput -"
    lost = sorted(((v, k) for k, v in totals["buckets"].items() if v > 0), reverse=True)
    unit, div = ("min", 60.0) if wall >= 600 else ("s", 1.0)

    def amount(seconds: float) -> str:
        x = seconds / div
        return f"{x:.1f}" if div == 1.0 and x < 10 else f"{x:.0f}"

    parts = ", ".join(f"{BUCKETS.get(k, k)} {amount(v)}" for v, k in lost[:top])
    if len(lost) > top:
        parts += ", ..."
    total = sum(v for v, _ in lost)
    return f"goodput {ratio * 100:.1f} % · lost {amount(total)} {unit}" + (f": {parts}" if parts else "")
