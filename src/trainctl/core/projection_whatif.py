"""The projection's view of each preset: its best known rate (:meth:`WhatIf.rate_for`), its
risk (:attr:`WhatIf.risks`, the preset history's estimate), and the what-if of switching
to it now.  A mixin of :class:`~trainctl.core.projection.Projector` (the state is the
projector's).  Pure.

Risk in a projection.  A preset with an incident rate ``r`` per hour run and a mean cost
``c`` seconds per incident loses ``r × c`` seconds per hour run: the remaining time ``T``
becomes ``T × (1 + r × c / 3600)`` (:func:`with_risk`), and the 5 % / 95 % rates give the
band.  Only a preset that has had an incident (this run, or earlier runs of the job on this
machine with the same preset content) is stretched: the estimator's prior alone (no
incident yet) never moves an ETA, so a run without history projects exactly as before.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from trainctl.core.preset_risk import Risk

if TYPE_CHECKING:
    from trainctl.core.rates import RateHistory

DEFAULT_JOB = "default"


def with_risk(now: float, eta: float, rate_per_h: float, cost_s: float) -> float:
    """``eta`` with the expected incident cost of the time left added."""
    return now + max(0.0, eta - now) * (1.0 + rate_per_h * cost_s / 3600.0)


def risk_view(risk: Risk) -> dict[str, Any]:
    """What a projection event says about a preset's risk (plain JSON)."""
    return {
        "hours": round(risk.hours, 4),
        "incidents": risk.incidents,
        "rate_per_h": risk.rate_per_h,
        "rate_low_per_h": risk.rate_low_per_h,
        "rate_high_per_h": risk.rate_high_per_h,
        "mean_cost_s": risk.mean_cost_s,
        "cost_measured": risk.cost_measured,
        "runs": risk.runs,
        "this_run": risk.this_run,
    }


def risky_band(
    now: float, eta: float, low: float | None, high: float | None, risk: Risk | None
) -> tuple[float, float | None, float | None]:
    """(eta, eta_low, eta_high) with ``risk`` applied (a preset with no incident: unchanged).
    The band's optimistic end takes the 5 % rate, its pessimistic end the 95 % rate."""
    if risk is None or risk.incidents == 0:
        return eta, low, high
    c = risk.mean_cost_s
    return (
        with_risk(now, eta, risk.rate_per_h, c),
        with_risk(now, low if low is not None else eta, risk.rate_low_per_h, c),
        with_risk(now, high if high is not None else eta, risk.rate_high_per_h, c),
    )


class WhatIf:
    """Rates, risks and the what-if of the other presets (a mixin of the projector)."""

    preset: str | None
    job: str
    deadline: float | None
    history: RateHistory | None
    expected_rates: dict[str, float | None]
    risks: dict[str, Risk]  # preset -> its estimate; written by the agent's preset feed only
    _measured: dict[str | None, float]
    _last: tuple[float, int, int, int] | None
    _resume_g: int | None
    _startups: list[float]

    # the projector's methods
    _resume_position: Callable[[], int]
    _cost: Callable[[float | None], float | None]
    _eta: Callable[
        [float, float, int, int, int, float, bool], float
    ]  # now, rate, g, total, batches, startup, in progress

    def risk_of(self, preset: str | None) -> Risk | None:
        return self.risks.get(preset or "")

    def rate_for(self, preset: str | None) -> tuple[float | None, str]:
        """The best known rate of a preset other than the running attempt's own data:
        measured in this run, then in earlier runs of the job (``history``), then the
        declared ``expected_rate`` (a figure from elsewhere: a prior, never "measured")."""
        if preset in self._measured:
            return self._measured[preset], "measured"
        if self.history is not None:
            r = self.history.rate(self.job, preset or DEFAULT_JOB)
            if r is not None:
                return r, "history"
        declared = self.expected_rates.get(preset) if preset is not None else None
        if declared is not None and declared > 0:
            return float(declared), "declared"
        return None, "unknown"

    def _what_if(self, now: float, total: int, batches: int, own: float | None) -> tuple[dict[str, Any], ...]:
        """Each other known preset, switched to now: a restart from the last checkpoint.

        A declared rate is a figure from another machine: once the running preset has a
        rate of its own here (``own``), another preset's declared rate is used only as a
        ratio to the running preset's declared one (``scaled``: 2.1 declared against A's
        2.4, with A measured at 14.3 here, gives 12.5); with no declared rate of the running
        preset to scale by, the declared figure stays ``declared`` (and every line that
        shows it says so: it compares a figure from elsewhere with a measurement here)."""
        names = {p for p in self.expected_rates} | {p for p in self._measured if p is not None}
        names.discard(self.preset)
        g_now = self._last[1] if self._last is not None else 0
        resume = min(self._resume_position(), g_now) if self._resume_g is None else self._resume_g
        startup = statistics.median(self._startups) if self._startups else 0.0
        mine = self.expected_rates.get(self.preset) if self.preset is not None else None
        out = []
        for name in sorted(names):
            rate, source = self.rate_for(name)
            item: dict[str, Any] = {
                "preset": name,
                "rate": rate,
                "source": source,
                "eta": None,
                "buffer_s": None,
                "cost_at_eta": None,
            }
            if source == "declared" and own is not None:
                item["declared"] = rate
                if mine:
                    rate = cast(float, rate) * own / mine
                    item.update(rate=rate, source="scaled", against=self.preset)
            risk = self.risk_of(name)
            if risk is not None:
                item["risk"] = risk_view(risk)
            if rate is not None:
                eta = self._eta(now, rate, resume, total, batches, startup, False)
                eta, low, high = risky_band(now, eta, None, None, risk)
                item.update(
                    eta=eta,
                    cost_at_eta=self._cost(eta),
                    buffer_s=self.deadline - eta if self.deadline is not None else None,
                )
                if low is not None and high is not None:
                    item.update(eta_low=low, eta_high=high)
            out.append(item)
        return tuple(out)
