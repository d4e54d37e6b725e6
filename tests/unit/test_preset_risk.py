"""The preset risk estimator (Gamma-Poisson): its quantiles against known values, the prior's
weight, and replayed histories of incidents whose true rate is known."""

from __future__ import annotations

import math
import random

import pytest

from trainctl.core.preset_risk import (
    DEFAULT_INCIDENT_COST_S,
    PRIOR_HOURS,
    PRIOR_INCIDENTS,
    estimate,
    gamma_cdf,
    gamma_quantile,
)


@pytest.mark.parametrize(
    ("q", "shape", "expected"),
    [
        (0.95, 1.0, -math.log(0.05)),  # Gamma(1) is the exponential
        (0.05, 1.0, -math.log(0.95)),
        (0.95, 0.5, 3.841459 / 2),  # Gamma(k/2, 1) = chi-square(k) / 2
        (0.05, 0.5, 0.00393214 / 2),
        (0.95, 3.5, 14.06714 / 2),
        (0.05, 3.5, 2.167350 / 2),
        (0.95, 50.5, 125.4584 / 2),  # chi-square(101)
    ],
)
def test_gamma_quantile_matches_known_values(q: float, shape: float, expected: float) -> None:
    assert gamma_quantile(q, shape) == pytest.approx(expected, rel=1e-5)


def test_gamma_cdf_matches_the_closed_form_for_shape_2() -> None:
    for x in (0.01, 0.5, 2.0, 3.0, 7.5, 40.0):
        assert gamma_cdf(x, 2.0) == pytest.approx(1 - math.exp(-x) * (1 + x), abs=1e-12)


def test_gamma_quantile_rejects_a_probability_outside_0_1() -> None:
    with pytest.raises(ValueError, match="quantile"):
        gamma_quantile(1.0, 2.0)


def test_no_data_gives_the_prior() -> None:
    r = estimate(0.0, 0)
    assert r.rate_per_h == pytest.approx(PRIOR_INCIDENTS / PRIOR_HOURS)
    assert r.mean_time_between_h == pytest.approx(PRIOR_HOURS / PRIOR_INCIDENTS)
    assert r.mean_cost_s == DEFAULT_INCIDENT_COST_S and not r.cost_measured
    assert r.rate_low_per_h < r.rate_per_h < r.rate_high_per_h


def test_the_issue_example_three_hangs_in_nine_hours_of_40_s_each() -> None:
    r = estimate(9.0, 3, cost_s_total=120.0)
    assert r.rate_per_h == pytest.approx(3.5 / 10.0)
    assert r.mean_cost_s == pytest.approx(40.0) and r.cost_measured
    assert r.loss_s_per_h == pytest.approx(0.35 * 40.0)
    assert r.rate_low_per_h == pytest.approx(2.167350 / 2 / 10.0, rel=1e-5)
    assert r.rate_high_per_h == pytest.approx(14.06714 / 2 / 10.0, rel=1e-5)


def test_clean_hours_lower_the_rate_and_narrow_the_interval() -> None:
    before, after = estimate(2.0, 0), estimate(30.0, 0)
    assert after.rate_per_h < before.rate_per_h
    assert after.rate_high_per_h - after.rate_low_per_h < before.rate_high_per_h - before.rate_low_per_h
    assert after.mean_time_between_h == pytest.approx(31.0 / 0.5)


def test_an_incident_raises_the_rate() -> None:
    assert estimate(5.0, 1).rate_per_h > estimate(5.0, 0).rate_per_h


def test_hostile_inputs_count_as_nothing() -> None:
    for r in (estimate(-3.0, -1), estimate(math.nan, 0), estimate(math.inf, 0)):
        assert r.hours == 0.0 and r.incidents == 0
        assert math.isfinite(r.rate_per_h) and r.rate_per_h > 0
    assert estimate(1.0, 0, cost_s_total=50.0).mean_cost_s == DEFAULT_INCIDENT_COST_S


def _replay(true_rate_per_h: float, hours: float, seed: int) -> int:
    """Incidents of a Poisson process of ``true_rate_per_h`` over ``hours``."""
    rng = random.Random(seed)
    t, k = rng.expovariate(true_rate_per_h), 0
    while t < hours:
        k += 1
        t += rng.expovariate(true_rate_per_h)
    return k


@pytest.mark.parametrize("true_rate", [0.05, 0.5, 2.0])
def test_replayed_histories_bracket_the_true_rate(true_rate: float) -> None:
    """Over many replayed 40-hour histories the 90 % interval holds the true rate about 90 %
    of the time, and the mean is close to it on average."""
    runs, covered, means = 400, 0, []
    for seed in range(runs):
        r = estimate(40.0, _replay(true_rate, 40.0, seed))
        covered += r.rate_low_per_h <= true_rate <= r.rate_high_per_h
        means.append(r.rate_per_h)
    assert 0.82 <= covered / runs <= 0.99
    assert sum(means) / runs == pytest.approx(true_rate, rel=0.2, abs=0.02)


def test_a_long_history_converges() -> None:
    true_rate = 0.4
    r = estimate(2000.0, _replay(true_rate, 2000.0, seed=7))
    assert r.rate_per_h == pytest.approx(true_rate, rel=0.1)
    assert r.rate_high_per_h / r.rate_low_per_h < 1.25
