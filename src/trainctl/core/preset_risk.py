"""How risky a preset is on this job and machine: its incident rate (hangs and crashes that
force a restart) estimated from few hours, with its uncertainty, and what one incident costs.
Pure: hours and costs are arguments; no I/O.

The estimate is Gamma-Poisson.  Incidents are taken as a Poisson process of unknown rate
``r`` per hour; the prior on ``r`` is ``Gamma(shape=PRIOR_INCIDENTS, rate=PRIOR_HOURS)``, as
if :data:`PRIOR_INCIDENTS` incidents had been seen in :data:`PRIOR_HOURS` hours.  After
``k`` incidents in ``h`` hours the posterior is ``Gamma(PRIOR_INCIDENTS + k, PRIOR_HOURS + h)``:
its mean is ``(PRIOR_INCIDENTS + k) / (PRIOR_HOURS + h)`` and its 5 % / 95 % quantiles bound
the rate.

The prior chosen: half an incident in one hour (``Gamma(0.5, 1 h)``).  The shape 0.5 is
Jeffreys' prior for a Poisson rate (it lets the data speak from the first incident on); the
one pseudo-hour keeps the estimate finite before any hour is run and says "an untried preset
is as likely as not to hang within its first two hours", which is what the notes behind
trainctl ask of a new preset ("test for 2-3 hours before trusting").  It weighs one hour
against the data: after 9 hours with 3 hangs the mean is 0.35/h (the data alone: 0.33/h);
after 30 clean hours it is 0.016/h, one incident in ~62 h.

What a prior must not do is move a projection by surprise: the projection adds an incident
cost only for a preset that has had an incident (see :mod:`trainctl.core.projection_whatif`), so a
run without any history projects exactly as it did before the history existed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PRIOR_INCIDENTS = 0.5  # Gamma prior shape: Jeffreys' 0.5 pseudo-incidents (see the module doc)
PRIOR_HOURS = 1.0  # Gamma prior rate: one pseudo-hour, so an untried preset is not trusted
# The cost of one incident when none was measured: a stall noticed after ~1 minute of silence
# (the detector's usual threshold once it has learned the batch times), ~15 s to kill and
# restart, ~30 s of start-up, and half of a 2-minute stretch redone.  Measured costs replace it.
DEFAULT_INCIDENT_COST_S = 165.0
LOW_QUANTILE = 0.05
HIGH_QUANTILE = 0.95


@dataclass(frozen=True)
class Risk:
    """A preset's incident rate on this job and machine, and the cost of one incident."""

    hours: float  # hours observed on this preset (this job, this machine)
    incidents: int  # hangs/crashes counted (the kinds that force a restart)
    rate_per_h: float  # posterior mean incidents per hour (Gamma-Poisson)
    rate_low_per_h: float  # 5 % quantile
    rate_high_per_h: float  # 95 % quantile
    mean_cost_s: float  # measured mean cost of one incident; DEFAULT_INCIDENT_COST_S when none measured
    cost_measured: bool = False  # whether mean_cost_s comes from measured incidents
    runs: int = 0  # how many runs of this job on this machine the figures are from (0: unknown)
    this_run: bool = False  # whether the run that shows them is one of those runs

    @property
    def loss_s_per_h(self) -> float:
        """Expected seconds lost to incidents per hour run on this preset."""
        return self.rate_per_h * self.mean_cost_s

    @property
    def mean_time_between_h(self) -> float:
        """Expected hours between two incidents (the inverse of the mean rate)."""
        return 1.0 / self.rate_per_h


def estimate(
    hours: float, incidents: int, cost_s_total: float = 0.0, runs: int = 0, this_run: bool = False
) -> Risk:
    """The risk after ``incidents`` in ``hours`` (negative inputs count as 0).
    ``cost_s_total`` is the summed measured cost of those incidents; 0 (nothing measured)
    gives :data:`DEFAULT_INCIDENT_COST_S` per incident.  ``runs`` and ``this_run`` say whose
    figures they are (the scope a count is shown with)."""
    h = max(float(hours), 0.0) if math.isfinite(hours) else 0.0
    k = max(int(incidents), 0)
    shape = PRIOR_INCIDENTS + k
    rate = PRIOR_HOURS + h
    measured = k > 0 and cost_s_total > 0.0 and math.isfinite(cost_s_total)
    return Risk(
        hours=h,
        incidents=k,
        rate_per_h=shape / rate,
        rate_low_per_h=gamma_quantile(LOW_QUANTILE, shape) / rate,
        rate_high_per_h=gamma_quantile(HIGH_QUANTILE, shape) / rate,
        mean_cost_s=cost_s_total / k if measured else DEFAULT_INCIDENT_COST_S,
        cost_measured=measured,
        runs=max(int(runs), 0),
        this_run=this_run,
    )


def gamma_cdf(x: float, shape: float) -> float:
    """The regularized lower incomplete gamma function P(shape, x): the CDF of a
    ``Gamma(shape, 1)`` variable at ``x`` (series below ``shape + 1``, continued fraction
    above; Numerical Recipes §6.2)."""
    if x <= 0.0:
        return 0.0
    log_front = shape * math.log(x) - x - math.lgamma(shape)
    if x < shape + 1.0:
        term = total = 1.0 / shape
        a = shape
        for _ in range(500):
            a += 1.0
            term *= x / a
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return min(total * math.exp(log_front), 1.0)
    tiny = 1e-300
    b = x + 1.0 - shape
    c = 1.0 / tiny
    d = 1.0 / b
    f = d
    for i in range(1, 500):
        an = -i * (i - shape)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        step = d * c
        f *= step
        if abs(step - 1.0) < 1e-15:
            break
    return max(1.0 - math.exp(log_front) * f, 0.0)


def gamma_quantile(q: float, shape: float) -> float:
    """The ``q`` quantile of ``Gamma(shape, 1)`` (bisection on :func:`gamma_cdf`, to a
    relative 1e-10); divide by the rate for ``Gamma(shape, rate)``."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {q}")
    lo, hi = 0.0, max(1.0, shape)
    while gamma_cdf(hi, shape) < q:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if gamma_cdf(mid, shape) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-10 * hi:
            break
    return 0.5 * (lo + hi)
