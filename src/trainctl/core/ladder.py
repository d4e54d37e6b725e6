"""The ladder: an ordered list of rungs (presets) from the fastest to the safest, and the
policy that moves a run along it.  Pure: the clock, the rates and the risks are arguments.

- A hang (a stall or a crash that forces a restart) steps down one rung (never below the
  safest).
- After a *stable stretch* on a rung (no hang for ``stretch_s``), the run steps up one rung
  only when the projection says it pays: the time the faster rung saves over the remaining
  work is greater than the extra incident cost expected there (its rate times its cost per
  incident over its time to finish, less the current rung's, plus the planned restart the
  step itself costs), and never when the deadline is
  nearer than one stretch.  A step up starts a new stretch, so there is at most one step up
  per stable stretch.
- The stretch is ``stable_s`` when the job sets it, else the longer of one epoch and the
  learned mean time between hangs of the rung above (the one a step up would try again).
- A rung the user chose (a key, the preset picker) is *pinned*: no automatic move until
  :meth:`LadderPolicy.unpin`.

Every move is a :class:`LadderStep` with its reason and numbers, journaled by the agent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from trainctl.core.projection_text import humanize_duration

SWITCH_COST_S = 60.0
"""What a step up costs by itself when nothing better is known: a planned restart's save,
start-up and the batches redone (the agent passes the measured start-up time)."""

STEP_UP_REASON = "ladder: one rung up to"
"""How the restart of a step up is journaled (the alerts leave it to the ladder's own message)."""

HANG_KINDS = ("stall", "crash")
"""The outcome kinds that step down: a deadlock or spin (a stall) or a crash."""


class RungRisk(Protocol):
    """What the ladder needs of a rung's risk (:class:`trainctl.core.preset_risk.Risk`)."""

    @property
    def rate_per_h(self) -> float: ...
    @property
    def mean_cost_s(self) -> float: ...
    @property
    def mean_time_between_h(self) -> float: ...


@dataclass(frozen=True)
class LadderStep:
    """One move on the ladder: ``direction`` down | up | start (where a run begins)."""

    direction: str
    from_rung: int
    to_rung: int
    reason: str
    numbers: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Payoff:
    """What a step up from ``rung`` would gain and risk over the remaining work (seconds)."""

    saved_s: float  # time to finish on the current rung less on the one above
    extra_cost_s: float  # expected incident cost there less here
    stretch_s: float

    @property
    def pays(self) -> bool:
        return self.saved_s > self.extra_cost_s


class LadderPolicy:
    """Where a run is on its ladder and when it moves (see the module doc)."""

    def __init__(
        self,
        rungs: Sequence[str],
        now: float,
        *,
        stable_s: float | None = None,
        start: int = 0,
        switch_cost_s: float = SWITCH_COST_S,
    ):
        if not rungs:
            raise ValueError("a ladder needs at least one rung")
        self.rungs = tuple(rungs)
        self.stable_s = stable_s
        self.rung = min(max(start, 0), len(self.rungs) - 1)
        self.stable_since = now
        self.pinned = False
        self.switch_cost_s = switch_cost_s  # a planned restart's cost (start-up, work redone)

    @property
    def preset(self) -> str:
        return self.rungs[self.rung]

    def index(self, preset: str | None) -> int | None:
        return self.rungs.index(preset) if preset in self.rungs else None

    # ------------------------------------------------------------------ moves
    def on_hang(self, now: float, what: str) -> LadderStep | None:
        """A hang on the current rung: one rung down (None when pinned or at the bottom;
        the stretch starts again either way)."""
        self.stable_since = now
        if self.pinned or self.rung >= len(self.rungs) - 1:
            return None
        step = LadderStep("down", self.rung, self.rung + 1, f"{what} on {self.preset}: one rung down")
        self.rung += 1
        return step

    def pin(self, preset: str | None, now: float) -> None:
        """The user chose ``preset``: the ladder stays there until :meth:`unpin`."""
        self.pinned = True
        self.stable_since = now
        if (i := self.index(preset)) is not None:
            self.rung = i

    def unpin(self, now: float) -> None:
        self.pinned = False
        self.stable_since = now

    def restarted(self, now: float) -> None:
        """A restart that is no hang (the user's, a step up): the stretch starts again."""
        self.stable_since = now

    # ------------------------------------------------------------------ stepping up
    def stretch_s(self, epoch_s: float | None, above: RungRisk | None) -> float:
        """How long the current rung must run without a hang before a step up is weighed."""
        if self.stable_s is not None:
            return self.stable_s
        mtbh = above.mean_time_between_h * 3600.0 if above is not None else 0.0
        return max(epoch_s or 0.0, mtbh if math.isfinite(mtbh) else 0.0)

    def payoff(
        self,
        remaining_batches: float,
        rates: Sequence[float | None],
        risks: Sequence[RungRisk | None],
        epoch_s: float | None,
    ) -> Payoff | None:
        """The step up's arithmetic, or None (at the top, or a rate unknown)."""
        if self.rung == 0:
            return None
        here, up = self.rung, self.rung - 1
        rate_here, rate_up = rates[here], rates[up]
        if not rate_here or not rate_up or rate_here <= 0 or rate_up <= 0:
            return None
        t_here = remaining_batches / rate_here
        t_up = remaining_batches / rate_up

        def cost(risk: RungRisk | None, t_s: float) -> float:
            return 0.0 if risk is None else risk.rate_per_h * (t_s / 3600.0) * risk.mean_cost_s

        return Payoff(
            saved_s=t_here - t_up,
            extra_cost_s=cost(risks[up], t_up) - cost(risks[here], t_here) + self.switch_cost_s,
            stretch_s=self.stretch_s(epoch_s, risks[up]),
        )

    def consider_up(
        self,
        now: float,
        remaining_batches: float,
        rates: Sequence[float | None],
        risks: Sequence[RungRisk | None],
        epoch_s: float | None = None,
        deadline: float | None = None,
    ) -> LadderStep | None:
        """A step up when the stretch is stable, the deadline far enough and it pays; else None."""
        if self.pinned:
            return None
        pay = self.payoff(remaining_batches, rates, risks, epoch_s)
        if pay is None or now - self.stable_since < pay.stretch_s:
            return None
        if deadline is not None and deadline - now < pay.stretch_s:
            return None
        if not pay.pays:
            return None
        up = self.rung - 1
        step = LadderStep(
            "up",
            self.rung,
            up,
            f"{self.preset} stable for {humanize_duration(now - self.stable_since)}; {self.rungs[up]} saves "
            f"{humanize_duration(pay.saved_s)} over the remaining work, more than its expected incident "
            f"cost ({humanize_duration(max(pay.extra_cost_s, 0.0))}): one rung up",
            {
                "stable_s": round(now - self.stable_since, 1),
                "saved_s": round(pay.saved_s, 1),
                "extra_cost_s": round(pay.extra_cost_s, 1),
                "remaining_batches": float(remaining_batches),
            },
        )
        self.rung = up
        self.stable_since = now
        return step

    # ------------------------------------------------------------------ words
    def describe(
        self,
        now: float,
        pay: Payoff | None = None,
        deadline: float | None = None,
    ) -> str:
        """For the dashboard: ``rung A2 (2 of 3), stable 14 min, next step up after 20 min if it pays``."""
        head = f"rung {self.preset} ({self.rung + 1} of {len(self.rungs)}), stable {humanize_duration(now - self.stable_since)}"
        if self.pinned:
            return f"{head}, pinned by you (trainctl ctl RUN ladder_unpin unpins)"
        if self.rung == 0:
            return f"{head}, the fastest rung"
        if pay is None:
            return f"{head}, a step up waits for both rungs' speeds"
        left = self.stable_since + pay.stretch_s - now
        if deadline is not None and deadline - now < pay.stretch_s:
            return f"{head}, no step up this close to the deadline"
        if left > 0:
            return f"{head}, next step up after {humanize_duration(left)} if it pays"
        if not pay.pays:
            return f"{head}, a step up does not pay (saves {humanize_duration(pay.saved_s)}, risks {humanize_duration(pay.extra_cost_s)})"
        return f"{head}, stepping up"
