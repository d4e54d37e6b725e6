"""Deadline and cost projection: ETA, buffer, cost, and the what-if
for every other preset.  Pure: time is always an argument (`now`); the only I/O is
:class:`~trainctl.core.rates.RateHistory`'s small JSON file.  The rate meter and history are
in :mod:`trainctl.core.rates`, the words in :mod:`trainctl.core.projection_text`.

Position is a global batch index ``g = (epoch - 1) * batches + batch`` (1-based epoch and
batch, as the trainer shows them), so epoch rollover, restarts and resumed runs compare
cleanly.  Speed is the median of recent bucket rates (a pause lands in one bucket and is
outvoted); the ETA band comes from the 10th/90th percentile bucket rates.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

from trainctl.core.events import Checkpoint, Event, Exit, Phase, Progress, Projection, Restart, Stall, Start
from trainctl.core.events import Warning as WarningEvent
from trainctl.core.preset_risk import Risk
from trainctl.core.projection_text import budget_warning, deadline_warning
from trainctl.core.projection_whatif import DEFAULT_JOB, WhatIf, risk_view, risky_band
from trainctl.core.rates import RateHistory, RateMeter
from trainctl.core.risk import RiskLatch

MIN_RECORDS = 5  # the current attempt's own rate is trusted from this many intervals on
HISTORY_EVERY_S = 600.0  # how often a running attempt's rate is written to the history
SAFE_MARGIN_S = 900.0  # "clearly safe": the pessimistic ETA this far before the deadline


# ---------------------------------------------------------------------------- projector
# The journaled event types a projector learns from (its rates, losses and restarts); a
# live agent gives it every batch's progress besides (the journal keeps about one a second).
LEARNS_FROM = frozenset({"start", "phase", "restart", "stall", "exit", "checkpoint"})


class Projector(WhatIf):
    """Consumes run events (:meth:`on_event`) and answers :meth:`project` / :meth:`at_risk`.

    Feed it every Start, Phase, Progress, Checkpoint, Stall, Restart and Exit in order.
    ``preset`` and ``expected_rates`` may be reassigned between attempts.
    """

    def __init__(
        self,
        deadline: float | None = None,
        cost_per_hour: float | None = None,
        budget: float | None = None,
        preset: str | None = None,
        expected_rates: dict[str, float | None] | None = None,
        history: RateHistory | None = None,
        window_s: float = 300.0,
        job: str | None = None,
    ):
        self.deadline = deadline
        self.cost_per_hour = cost_per_hour
        self.budget = budget
        self.preset = preset
        self.expected_rates: dict[str, float | None] = dict(expected_rates or {})
        self.history = history
        self.job = job or DEFAULT_JOB
        self.risks: dict[str, Risk] = {}  # preset -> its risk (src/trainctl/agent/preset_feed.py)
        self._meter = RateMeter(window_s)
        self._measured: dict[str | None, float] = {}
        self._run_rate: float | None = None  # the last rate this run measured, any preset
        self._history_ts: float | None = None
        # time
        self._first_ts: float | None = None
        self._attempt_ts: float | None = None  # Start of the current attempt
        self._attempt_progressed = False
        self._startups: list[float] = []  # Start -> first progress, per attempt
        self._finished_ts: float | None = None
        # position
        self._epochs: int | None = None
        self._batches: int | None = None
        self._single_pass_broken = False
        self._last: tuple[float, int, int, int] | None = None  # ts, g, epoch, batch
        self._labelled = True  # progress carries an epoch number
        self._chain = False  # _last is in the same unbroken attempt
        self._resume_g: int | None = None  # where a restarted attempt should resume
        self._ckpt_epoch: int | None = None
        self._ckpt: tuple[float, int | None, int | None, str] | None = None  # ts, epoch, batch, kind
        self._redone: list[int] = []
        self._restarted = False  # the first batch of this attempt is a resume
        self._high_water = 0
        # epoch overhead
        self._boundaries: list[tuple[float, int]] = []  # (gap_s, batches done in new epoch)
        self._phase = "startup"
        self._phase_ts: float | None = None
        self._phase_s: dict[str, list[float]] = {"val": [], "save": []}
        # stalls
        self._stalled_since: float | None = None  # a stall no batch and no new attempt ended
        self._risk = {"deadline": RiskLatch(), "budget": RiskLatch()}
        # a Slurm run: this job's work ends at job_end; each next job gives job_span_s of
        # work after job_gap_s (queue wait and start); None: no such limit
        self.job_end: float | None = None
        self.job_span_s: float | None = None
        self.job_gap_s: float = 0.0
        self.job_gap_measured = False  # False: a queue wait alone; the start is added

    # ------------------------------------------------------------------ events
    def catch_up(self, events: Iterable[Event]) -> None:
        """Learn from events an earlier agent journaled (and projected from): the same as
        :meth:`on_event`, but nothing goes into the rate history again (that agent wrote it),
        and its next write is due ``HISTORY_EVERY_S`` after the last event's time."""
        history, self.history = self.history, None
        last: float | None = None
        try:
            for ev in events:
                self.on_event(ev)
                last = ev.ts
        finally:
            self.history = history
        if last is not None:
            self._history_ts = last

    def on_event(self, ev: Event) -> None:
        if self._first_ts is None and isinstance(ev, (Start, Progress)):
            self._first_ts = ev.ts
        match ev:
            case Progress():
                self._on_progress(ev)
            case Phase():
                self._set_phase(ev.phase, ev.ts)
                if ev.phase == "finished":
                    self._finish(ev.ts)
            case Start():
                self._stalled_since = None
                self._attempt_ts = ev.ts
                self._attempt_progressed = False
                self._finished_ts = None
                if ev.preset is not None:
                    self.preset = ev.preset
                self._meter.reset()
                self._chain = False
                self._phase, self._phase_ts = "startup", ev.ts  # an interrupted phase is no sample
            case Restart():
                self._stalled_since = None  # restarting: the new attempt's start-up, no stall
                self._end_attempt(ev.ts)
                self._resume_g = self._resume_position() if ev.resume_from else 0
                self._restarted = True
                self._attempt_ts = ev.ts + ev.delay_s  # the next attempt starts after the delay
                self._attempt_progressed = False
                if ev.preset is not None:
                    self.preset = ev.preset
            case Stall():
                self._stalled_since = ev.ts - ev.idle_s
                self._end_attempt(ev.ts)
                self._phase_ts = None  # the stalled phase's length is no sample
            case Exit():
                self._end_attempt(ev.ts)
                if ev.returncode == 0 and self._finished_ts is None and self._last is not None:
                    self._finish(ev.ts)
            case Checkpoint():
                # epoch None with a batch: a position on an open step counter (nanoGPT's iter N)
                if ev.ok and (ev.epoch is not None or ev.batch is not None):
                    if ev.batch is None:
                        self._ckpt_epoch = ev.epoch
                    self._ckpt = (ev.ts, ev.epoch, ev.batch, ev.kind)

    def _on_progress(self, ev: Progress) -> None:
        if ev.rank not in (None, 0):
            return
        self._stalled_since = None
        if ev.epochs is not None:
            self._epochs = ev.epochs
        if ev.batches is not None:
            self._batches = ev.batches
        if ev.batch is None or (self._batches is None and ev.epoch is not None):
            return  # a batch of an epoch of unknown length has no global position
        self._labelled = ev.epoch is not None
        epoch = ev.epoch if ev.epoch is not None else 1
        # no epoch and no count: an open step counter (nanoGPT's "iter N"), its own position
        g = ev.batch if self._batches is None else (epoch - 1) * self._batches + ev.batch
        ts = ev.ts
        last = self._last if self._chain else None
        if ev.epoch is None and last is not None and g < last[1]:
            self._single_pass_broken = True  # an unlabelled counter restarted: total unknown
        if not self._attempt_progressed:
            self._attempt_progressed = True
            if self._restarted:  # it resumed after g - 1: what it had done past that is redone
                self._restarted = False
                self._redone.append(max(0, self._high_water - (g - 1)))
            self._resume_g = None
            if self._attempt_ts is not None:
                self._startups.append(max(0.0, ts - self._attempt_ts))
        if self._phase != "train":
            self._set_phase("train", ts)
        if last is not None and epoch != last[2]:
            batches_before = last[3]
            if self._batches is not None and epoch == last[2] + 1 and batches_before >= self._batches:
                self._boundaries.append((ts - last[0], ev.batch))
                del self._boundaries[:-50]
            self._meter.cut()
        self._meter.add(ts, g)
        self._high_water = max(self._high_water, g)
        self._last = (ts, g, epoch, ev.batch)
        self._chain = True

    def _set_phase(self, phase: str, ts: float) -> None:
        if self._phase in self._phase_s and self._phase_ts is not None and phase != self._phase:
            self._phase_s[self._phase].append(max(0.0, ts - self._phase_ts))
            del self._phase_s[self._phase][:-50]
        if phase != self._phase or self._phase_ts is None:
            self._phase_ts = ts
            if phase != "train":
                self._meter.cut()
        self._phase = phase

    def _finish(self, ts: float) -> None:
        self._finished_ts = ts
        self._remember(ts, force=True)

    def _end_attempt(self, ts: float) -> None:
        self._remember(ts, force=True)
        est = self._meter.estimate()
        if est is not None and est.rate > 0:
            self._run_rate = est.rate
        self._meter.cut()
        self._chain = False

    def _resume_position(self) -> int:
        """Where a restart from the last checkpoint resumes: the end of the last checkpointed
        epoch, else the start of the current epoch."""
        ckpt_g = self._ckpt_g()
        if self._batches is None or self._last is None:
            return ckpt_g if ckpt_g is not None else 0  # an open step counter's checkpoint
        if ckpt_g is not None and self._ckpt is not None and self._ckpt[2] is not None:
            return ckpt_g
        epoch = self._last[2]
        done = epoch - 1
        if self._ckpt_epoch is not None and self._ckpt_epoch <= epoch:
            done = self._ckpt_epoch
        return max(0, done) * self._batches

    def _ckpt_g(self) -> int | None:
        """The global batch the last good checkpoint holds (its epoch 1-based; batch None:
        the whole epoch)."""
        if self._ckpt is None:
            return None
        _ts, epoch, batch, _kind = self._ckpt
        if epoch is None:  # a position on an open step counter
            return batch
        if self._batches is None:
            return None
        return (epoch - 1) * self._batches + batch if batch is not None else epoch * self._batches

    def redone_since_checkpoint(self) -> int | None:
        """The batches done past the last good checkpoint (a restart from it does them
        again); None: no checkpoint with a position, or no batch count."""
        view = self._checkpoint_view()
        return None if view is None else view["lose"]

    def _checkpoint_view(self) -> dict[str, Any] | None:
        if self._ckpt is None:
            return None
        ts, epoch, batch, kind = self._ckpt
        g = self._ckpt_g()
        lose = max(0, self._high_water - g) if g is not None else None
        return {"ts": ts, "epoch": epoch, "batch": batch, "kind": kind, "lose": lose}

    def _remember(self, ts: float, force: bool = False) -> None:
        """Keep the current attempt's measured rate for its preset (and in the history)."""
        est = self._meter.estimate()
        if est is None or est.records < MIN_RECORDS or est.rate <= 0:
            return
        self._measured[self.preset] = self._run_rate = est.rate
        if self.history is not None and (
            force or self._history_ts is None or ts - self._history_ts >= HISTORY_EVERY_S
        ):
            self._history_ts = ts
            self.history.record(self.job, self.preset or DEFAULT_JOB, est.rate, ts)

    # ------------------------------------------------------------------ rates
    def _current_rate(self) -> tuple[float | None, float | None, float | None, str | None]:
        """(rate, low, high, source) of the running preset: its own rate once it has
        ``MIN_RECORDS`` intervals; before that what this run or earlier runs measured of the
        preset, then the attempt's first intervals, and only with none of those the
        preset's declared rate.  A finished run reports what it measured, never a declared
        figure."""
        est = self._meter.estimate()
        if est is not None and est.records >= MIN_RECORDS and est.rate > 0:
            return est.rate, est.low, est.high, "measured"
        known, source = self.rate_for(self.preset)
        if known is not None and source != "declared":
            return known, None, None, source
        if est is not None and est.rate > 0:
            return est.rate, None, None, "measured"
        if self._finished_ts is not None:
            return (self._run_rate, None, None, "measured") if self._run_rate else (None, None, None, None)
        if known is not None:
            return known, None, None, "declared"
        return None, None, None, None

    def basis(self) -> tuple[bool, bool]:
        """What a projection can stand on now: (total work known, own rate measured).
        A change is worth a projection at once (the first one of a run says "unknown")."""
        return self._total() is not None, len(self._meter.records) >= MIN_RECORDS

    # ------------------------------------------------------------------ time left
    def _total(self) -> int | None:
        if self._batches is None or self._single_pass_broken or self._last is None:
            return None
        if self._epochs is not None:
            return self._epochs * self._batches
        if not self._labelled:
            return self._batches  # no epoch counter at all: one pass over `batches`
        return None

    def _epoch_overhead(self, rate: float) -> float:
        """Seconds per epoch end (validation, saving, workers restarting): from observed
        epoch rollovers, else from the val/save phases seen, else 0."""
        if self._boundaries:
            return statistics.median(max(0.0, gap - b / rate) for gap, b in self._boundaries)
        return sum(statistics.median(v) for v in self._phase_s.values() if v)

    def _eta(
        self,
        now: float,
        rate: float,
        g: int,
        total: int,
        batches: int,
        startup_left: float,
        in_progress: bool,
    ) -> float:
        """Finish time from position g at `rate`, with the per-epoch overhead."""
        overhead = self._epoch_overhead(rate)
        epochs = math.ceil(total / batches)
        if in_progress and self._last is not None:
            t_last, _, _, batch = self._last
            since = max(0.0, now - t_last)
            if batch >= batches:  # between epochs: this boundary is partly behind us
                left_overhead = max(0.0, overhead - since) + (epochs - math.ceil(g / batches)) * overhead
                work = (total - g) / rate
            else:
                left_overhead = (epochs - g // batches) * overhead
                work = max(0.0, (total - g) / rate - min(since, 1.0 / rate))
        else:
            left_overhead = (epochs - g // batches) * overhead
            work = (total - g) / rate
        return now + startup_left + work + left_overhead

    def _startup_left(self, now: float) -> float:
        if self._attempt_progressed or self._attempt_ts is None or not self._startups:
            return 0.0
        return max(0.0, statistics.median(self._startups) - (now - self._attempt_ts))

    def _cost(self, until: float | None) -> float | None:
        if self.cost_per_hour is None or self._first_ts is None or until is None:
            return None
        return max(0.0, until - self._first_ts) / 3600.0 * self.cost_per_hour

    # ------------------------------------------------------------------ projection
    def project(self, now: float) -> Projection | None:
        """The projection at `now`; None until any Start or Progress has been seen."""
        if self._first_ts is None:
            return None
        self._remember(now)
        rate, low, high, source = self._current_rate()
        total, batches = self._total(), self._batches
        risk = self.risk_of(self.preset)
        end = self._finished_ts if self._finished_ts is not None else now
        eta = eta_low = eta_high = None
        what_if: tuple[dict[str, Any], ...] = ()
        if self._finished_ts is not None:
            eta = self._finished_ts
        elif rate and total and batches and self._last is not None:
            in_progress = self._attempt_progressed or self._attempt_ts is None
            g = self._last[1] if in_progress or self._resume_g is None else self._resume_g
            g = min(g, total)
            startup = self._startup_left(now)
            eta = self._in_jobs(now, self._eta(now, rate, g, total, batches, startup, in_progress))
            if low and high and low > 0:
                eta_high = self._in_jobs(now, self._eta(now, low, g, total, batches, startup, in_progress))
                eta_low = self._in_jobs(now, self._eta(now, high, g, total, batches, startup, in_progress))
            eta, eta_low, eta_high = risky_band(now, eta, eta_low, eta_high, risk)
            what_if = self._what_if(now, total, batches, rate if source != "declared" else None)
        buffer_s = self.deadline - eta if self.deadline is not None and eta is not None else None
        return Projection(
            now,
            eta,
            self.deadline,
            buffer_s,
            rate,
            self._cost(end),
            self._cost(eta),
            eta_low,
            eta_high,
            self.budget,
            what_if,
            finished=self._finished_ts is not None,
            checkpoint=self._checkpoint_view(),
            redone=tuple(self._redone),
            rate_source=source if rate else None,
            preset=self.preset,
            risk=risk_view(risk) if risk is not None else None,
            stalled_since=self._stalled_since if self._finished_ts is None else None,
        )

    def _in_jobs(self, now: float, eta: float) -> float:
        gap = self.job_gap_s
        if not self.job_gap_measured and self._startups:  # each next job starts the trainer again
            gap += statistics.median(self._startups)
        return across_jobs(now, eta, self.job_end, self.job_span_s, gap)

    # ------------------------------------------------------------------ risk
    def at_risk(self, now: float) -> WarningEvent | None:
        """A ``deadline.at_risk`` / ``budget.at_risk`` warning, once per crossing; it re-arms
        only after the projection has been clearly safe for
        :data:`~trainctl.core.risk.REARM_S` (:class:`~trainctl.core.risk.RiskLatch`)."""
        p = self.project(now)
        if p is None or self._finished_ts is not None or p.eta is None:
            return None
        pessimistic = p.eta_high if p.eta_high is not None else p.eta
        found: WarningEvent | None = None
        if self.deadline is not None:
            margin = max(SAFE_MARGIN_S, 0.02 * max(0.0, p.eta - now))
            if self._risk["deadline"].update(
                now, pessimistic > self.deadline, pessimistic <= self.deadline - margin, True
            ):
                found = deadline_warning(p, now)
        cost = self._cost(pessimistic)
        if self.budget is not None and cost is not None:
            # one warning per call: a budget warning due now comes with the next call
            if self._risk["budget"].update(
                now, cost > self.budget, cost <= 0.98 * self.budget, found is None
            ):
                found = budget_warning(p, now, cost)
        return found


def across_jobs(now: float, eta: float, job_end: float | None, span_s: float | None, gap_s: float) -> float:
    """The end of work that would end at ``eta`` without a time limit, when the job it runs
    in stops at ``job_end`` and each next job does ``span_s`` of it after ``gap_s`` of queue
    wait and start (a Slurm run: its limit is a deadline within each job)."""
    if job_end is None or not span_s or span_s <= 0 or eta <= job_end:
        return eta
    base = max(now, job_end)
    left = eta - base  # the work this job cannot do
    return base + math.ceil(left / span_s) * gap_s + left
