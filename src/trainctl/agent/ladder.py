"""The run's ladder in the agent: the one owner of its :class:`~trainctl.core.ladder.LadderPolicy`.

It feeds the pure policy the clock, each rung's rate and risk (the projector's: measured in
this run, in earlier runs, or declared; the preset history's risk) and the remaining work
(the last projection), and acts on what it decides:

- after an attempt ends (:meth:`LadderKeeper.after`): a hang steps down, the restart uses
  the new rung (the recovery policy's fallback is not used);
- on each projection while a trainer runs in its train phase: a step up is a planned restart
  (the attempt loop asks the trainer to save first, as for ``r``);
- a preset the user chose (a key, the picker, ``ctl restart --preset``) pins the ladder;
  ``ctl ladder-unpin`` (the dashboard's ``u``) unpins it.

Each move is journaled (:class:`~trainctl.core.events.LadderMove`) and remembered for the
job's next run on this machine (:class:`~trainctl.store.ladder_memory.LadderMemory`).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from trainctl.core import events as E
from trainctl.core.ladder import HANG_KINDS, STEP_UP_REASON, LadderPolicy, LadderStep
from trainctl.core.recovery import Decision, Outcome, RunState
from trainctl.store.ladder_memory import LadderMemory


class LadderKeeper:
    def __init__(self, ctx: Any, memory: LadderMemory | None = None) -> None:
        self.ctx = ctx
        spec = ctx.spec
        self.memory = memory or LadderMemory()
        rungs = tuple(spec.ladder)
        start = rungs.index(spec.preset) if spec.preset in rungs else 0
        remembered = self._remembered(rungs)
        self._start: LadderStep | None = None
        if remembered is not None and rungs.index(remembered) != start:
            i = rungs.index(remembered)
            why = f"the last run of {spec.job_name} on {spec.host} settled on {remembered}: it starts there"
            self._start = LadderStep("start", start, i, why)
            start = i
            ctx.facts.preset = ctx.projector.preset = rungs[i]
        self.policy = LadderPolicy(rungs, ctx.clock(), stable_s=spec.ladder_stable_s, start=start)
        self.planned: str | None = None  # the rung of a step up asked for, until its restart
        self.phase = "startup"
        self.batches: int | None = None  # batches per epoch (the last progress said)
        self.diagnosis = "a stall"
        self.projection: E.Projection | None = None  # the last one
        self.started: float | None = None  # the running attempt's start, until its first batch
        self.startups: list[float] = []  # seconds from a start to its first batch

    def _remembered(self, rungs: tuple[str, ...]) -> str | None:
        try:
            return self.memory.rung(self.ctx.spec.job_name, self.ctx.spec.host, rungs)
        except OSError:
            return None
        finally:
            self._say_problems()

    def _say_problems(self) -> None:
        """What the memory met (a damaged file set aside, an untrusted data directory), once."""
        for text in self.memory.problems:
            self.ctx.info(text, "ladder_memory")
        self.memory.problems.clear()

    # ------------------------------------------------------------------ journal
    def _journal(self, step: LadderStep) -> None:
        p = self.policy
        self.ctx.emit(
            E.LadderMove(
                self.ctx.clock(),
                step.direction,
                p.rungs[step.from_rung] if step.from_rung != step.to_rung else None,
                p.rungs[step.to_rung],
                step.to_rung + 1,
                p.rungs,
                step.reason,
                dict(step.numbers),
            )
        )
        try:
            self.memory.remember(
                self.ctx.spec.job_name, self.ctx.spec.host, p.rungs, p.preset, self.ctx.clock()
            )
        except OSError as e:  # a full disk: the run goes on, the next one starts on its first rung
            self.ctx.info(f"cannot remember the ladder's rung in {self.memory.path}: {e}", "ladder_memory")
        self._say_problems()

    # ------------------------------------------------------------------ the attempt loop's hooks
    def before_attempt(self, preset: str | None) -> None:
        """An attempt starts with ``preset``: a rung other than the ladder's was chosen by
        the user (picked during a back-off): the ladder pins it."""
        if self._start is not None:
            self._journal(self._start)
            self._start = None
        if preset != self.policy.preset and preset is not None:
            self.pin(preset, "picked by you")

    def after(self, outcome: Outcome, decision: Decision) -> Decision:
        """The restart ``decision`` of the recovery policy, with the ladder's rung."""
        p, now = self.policy, self.ctx.clock()
        if self.planned is None or outcome.kind in HANG_KINDS:  # a step up in flight has moved it
            self.sync(outcome.preset)
        if decision.action != "restart":
            return decision
        if outcome.kind in HANG_KINDS:
            self.planned = None
            what = self.diagnosis if outcome.kind == "stall" else "a crash"
            step = p.on_hang(now, what)
            base = decision.reason.split("; falling back")[0]
            if step is None:
                return dataclasses.replace(decision, preset=p.preset, reason=base)
            self._journal(step)
            return dataclasses.replace(
                decision, preset=p.preset, reason=f"{base}; ladder: one rung down to {p.preset}"
            )
        if self.planned is not None and outcome.requested_preset == self.planned:
            self.planned = None
            return dataclasses.replace(decision, reason=f"{STEP_UP_REASON} {p.preset}")
        self.planned = None
        if decision.preset is not None and decision.preset != p.preset:
            self.pin(decision.preset, "chosen by you")
        else:
            p.restarted(now)
        return decision

    def sync(self, preset: str | None) -> None:
        """The rung that ran is ``preset`` (an agent that took over a run starts on the job's
        first rung): the ladder goes on from there, unpinned, without a move."""
        i = self.policy.index(preset)
        if i is not None and i != self.policy.rung and not self.policy.pinned:
            self.policy.rung = i

    def pin(self, preset: str, how: str) -> None:
        p = self.policy
        before = p.rung
        p.pin(preset, self.ctx.clock())
        where = f"rung {p.rung + 1} of {len(p.rungs)}" if preset in p.rungs else "not one of its rungs"
        self._journal(
            LadderStep(
                "pin", before, p.rung, f"preset {preset} {how} ({where}): the ladder stays until unpinned"
            )
        )

    def unpin(self) -> bool:
        p = self.policy
        if not p.pinned:
            return False
        p.unpin(self.ctx.clock())
        self._journal(LadderStep("unpin", p.rung, p.rung, f"unpinned on {p.preset}: the ladder moves again"))
        return True

    # ------------------------------------------------------------------ events: the step up
    def __call__(self, ev: E.Event) -> None:
        if isinstance(ev, E.Phase):
            self.phase = ev.phase
        elif isinstance(ev, E.Start):
            self.phase, self.started = "startup", ev.ts
            self.before_attempt(ev.preset)
        elif isinstance(ev, E.Progress):
            self.batches = ev.batches or self.batches
            if self.started is not None:  # a step up costs a start-up: the measured one
                self.startups.append(ev.ts - self.started)
                self.policy.switch_cost_s = statistics.median(self.startups)
                self.started = None
        elif isinstance(ev, (E.Stall, E.StallDiagnosis)):  # the stall at detection, then its verdict
            self.diagnosis = f"a {ev.diagnosis}" if ev.diagnosis in ("deadlock", "spin") else "a stall"
        elif isinstance(ev, E.Projection) and not ev.finished:
            self.projection = ev
            self._consider_up(ev)

    def inputs(self, proj: E.Projection | None) -> dict[str, Any]:
        """The policy's inputs now: each rung's rate and risk, the remaining batches, an epoch."""
        p, projector = self.policy, self.ctx.projector
        rates: list[float | None] = []
        for i, rung in enumerate(p.rungs):
            own = proj is not None and i == p.rung and proj.preset == rung
            rates.append(proj.rate if own and proj is not None else projector.rate_for(rung)[0])
        here = rates[p.rung]
        remaining = None
        if proj is not None and proj.eta is not None and proj.rate:
            remaining = max(0.0, proj.eta - proj.ts) * proj.rate
        return {
            "rates": rates,
            "risks": [projector.risk_of(r) for r in p.rungs],
            "remaining": remaining,
            "epoch_s": self.batches / here if self.batches and here else None,
        }

    def _consider_up(self, proj: E.Projection) -> None:
        ctx, p = self.ctx, self.policy
        if self.planned is not None or self.phase != "train" or ctx.sm.state != RunState.RUNNING:
            return
        self.sync(ctx.facts.preset)
        if ctx.facts.trainer is None or ctx.facts.preset != p.preset:
            return
        got = self.inputs(proj)
        if got["remaining"] is None:
            return
        step = p.consider_up(
            proj.ts, got["remaining"], got["rates"], got["risks"], got["epoch_s"], ctx.spec.deadline
        )
        if step is None:
            return
        if not ctx.requests.restart(p.preset):  # the attempt already ends: not now
            p.rung = step.from_rung
            return
        self.planned = p.preset
        self._journal(step)

    # ------------------------------------------------------------------ words
    def describe(self, proj: E.Projection | None = None) -> str:
        """``rung A2 (2 of 3), stable 14 min, next step up after 20 min if it pays``."""
        got = self.inputs(proj or self.projection)
        pay = None
        if got["remaining"] is not None:
            pay = self.policy.payoff(got["remaining"], got["rates"], got["risks"], got["epoch_s"])
        return self.policy.describe(self.ctx.clock(), pay, self.ctx.spec.deadline)
