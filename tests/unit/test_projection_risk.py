"""Risk in the projection: each preset's ETA carries its expected incident cost (rate × mean
cost per hour run, from the preset history), with the band from the 5 % / 95 % rates; a
preset without an incident, and a run without history, project exactly as before."""

from __future__ import annotations

import pytest

from trainctl.core import events as E
from trainctl.core.preset_risk import estimate
from trainctl.core.projection import Projector
from trainctl.core.projection_text import format_projection, format_what_if
from trainctl.core.projection_whatif import with_risk

pytestmark = pytest.mark.timeout(30)

BATCHES, EPOCHS = 10_000, 10
T0 = 1_700_000_000.0


def _run(pj: Projector, rate: float = 2.4, n: int = 61) -> float:
    pj.on_event(E.Start(T0, 1, 100, "A"))
    t, batch = T0 + 60.0, 24
    for _ in range(n):
        pj.on_event(E.Progress(t, 1, EPOCHS, batch, BATCHES))
        t += 10.0
        batch += round(rate * 10)
    return t - 10.0


def _projector(**kw) -> Projector:
    return Projector(preset="A", expected_rates={"A": 2.4, "B": 2.1}, deadline=T0 + 86400, **kw)


def test_with_risk_adds_the_expected_incident_cost_of_the_time_left() -> None:
    # 0.35 incidents per hour × 40 s each = 14 s per hour: 10 h left become 10 h 2 m 20 s
    assert with_risk(0.0, 36000.0, 0.35, 40.0) - 36000.0 == pytest.approx(140.0)
    assert with_risk(100.0, 50.0, 1.0, 60.0) == 100.0  # nothing left: nothing added


def test_no_history_projects_as_before() -> None:
    plain, fed = _projector(), _projector()
    fed.risks = {"A": estimate(0.0, 0), "B": estimate(30.0, 0)}  # the prior alone, clean hours
    t = _run(plain)
    assert _run(fed) == t
    p, q = plain.project(t), fed.project(t)
    assert (q.eta, q.eta_low, q.eta_high) == (p.eta, p.eta_low, p.eta_high)
    assert [w["eta"] for w in q.what_if] == [w["eta"] for w in p.what_if]
    assert "0 incidents in 30 h" in format_what_if(q.what_if[0], t)
    assert "eta_low" not in q.what_if[0]


def test_the_issue_example_three_hangs_in_nine_hours() -> None:
    """A: 3 hangs in 9 h of 40 s each; B: 0 in 30 h.  A's ETA moves by its expected cost,
    with a band; B's does not."""
    plain, pj = _projector(), _projector()
    pj.risks = {"A": estimate(9.0, 3, 120.0), "B": estimate(30.0, 0)}
    t = _run(plain)
    _run(pj)
    p, q = plain.project(t), pj.project(t)
    left = p.eta - t
    assert q.eta - t == pytest.approx(left * (1 + 0.35 * 40.0 / 3600.0))
    low, high = estimate(9.0, 3).rate_low_per_h, estimate(9.0, 3).rate_high_per_h
    assert q.eta_low == pytest.approx(t + left * (1 + low * 40.0 / 3600))
    assert q.eta_high == pytest.approx(t + left * (1 + high * 40.0 / 3600))
    assert q.risk is not None and q.risk["incidents"] == 3
    assert q.buffer_s == pytest.approx(q.deadline - q.eta)
    (b,) = q.what_if
    assert b["eta"] == p.what_if[0]["eta"] and b["risk"]["hours"] == 30.0
    line = format_projection(q, t)[0]
    assert "2.40 it/s, 3 incidents in 9 h (≈ 40 s each)" in line


def test_a_what_if_with_incidents_has_a_band_and_says_so() -> None:
    pj = _projector()
    pj.risks = {"B": estimate(2.0, 4, 4 * 300.0)}
    t = _run(pj)
    (b,) = pj.project(t).what_if
    assert b["eta_low"] < b["eta"] < b["eta_high"]
    text = format_what_if(b, t)
    assert "4 incidents in 2 h (≈ 5 m each)" in text and "±" in text


def test_an_unmeasured_cost_says_it_is_the_default() -> None:
    pj = _projector()
    pj.risks = {"B": estimate(2.0, 1)}
    t = _run(pj)
    assert "not measured yet" in format_what_if(pj.project(t).what_if[0], t)


def test_the_deadline_warning_uses_the_risky_eta() -> None:
    """A run that makes its deadline on speed alone, but not with its hangs: warned."""
    safe, risky = Projector(preset="A"), Projector(preset="A")
    for pj in (safe, risky):
        pj.deadline = T0 + 60 + (EPOCHS * BATCHES) / 2.4 * 1.02
    risky.risks = {"A": estimate(9.0, 9, 9 * 600.0)}  # ~1 hang per hour of 10 minutes each
    t = _run(safe)
    _run(risky)
    assert safe.at_risk(t) is None
    w = risky.at_risk(t)
    assert w is not None and w.id == "deadline.at_risk"


def test_the_dashboard_panel_says_the_risk_wide_and_narrow() -> None:
    from trainctl.tui.widgets.projection_panel import projection_text

    pj = _projector()
    pj.risks = {"A": estimate(9.0, 3, 120.0), "B": estimate(2.0, 4, 1200.0)}
    t = _run(pj)
    p = pj.project(t)
    wide = projection_text(p, t).plain
    assert "3 incidents in 9 h (≈ 40 s each)" in wide and "4 incidents in 2 h (≈ 5 m each)" in wide
    assert "B (~declared) (4 in 2 h): ETA " in projection_text(p, t, wide=False).plain


def test_every_count_says_whose_runs_it_is_of() -> None:
    """A preset's incidents are counted over runs of this job on this machine: the line says
    which ('this run', 'this job here, 12 runs', '3 earlier runs of this job here')."""
    from trainctl.tui.widgets.projection_panel import projection_text

    pj = _projector()
    pj.risks = {"A": estimate(9.0, 3, 120.0, runs=12, this_run=True), "B": estimate(2.0, 4, 1200.0, runs=3)}
    t = _run(pj)
    p = pj.project(t)
    line = format_projection(p, t)[0]
    assert "3 incidents in 9 h (this job here, 12 runs; ≈ 40 s each)" in line
    assert "4 incidents in 2 h (3 earlier runs of this job here; ≈ 5 m each)" in format_what_if(
        p.what_if[0], t
    )
    assert "B (~declared) (4 in 2 h, 3 earlier runs): ETA " in projection_text(p, t, wide=False).plain
    pj.risks = {"A": estimate(2.0, 1, 60.0, runs=1, this_run=True)}
    assert "1 incident in 2 h (this run; ≈ 1 m each)" in format_projection(pj.project(t), t)[0]
