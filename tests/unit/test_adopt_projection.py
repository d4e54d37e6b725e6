"""A new agent's projection goes on from the run's journal (agent/adopt.py
projector_catches_up): after a takeover the rate shown is the current attempt's, the cost
counts from the run's first start, and a 2-rank run's rate is one rank's."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainctl.agent.adopt import projector_catches_up
from trainctl.core import events as E
from trainctl.core.projection import Projector
from trainctl.core.rates import RateHistory
from trainctl.store.journal import Journal

pytestmark = pytest.mark.timeout(30)

T0 = 1_700_000_000.0


def journal(path: Path, events: list[E.Event]) -> Path:
    j = Journal(path)
    for ev in events:
        j.append(ev)
    j.close()
    return path


def attempt(t: float, rate: float, seconds: int, rank: int | None = None) -> list[E.Event]:
    """Progress about once a second (the journal's throttle) at ``rate`` batches a second."""
    return [E.Progress(t + i, 1, 1, 1 + round(i * rate), 100_000, rank=rank) for i in range(seconds)]


def test_the_rate_after_a_takeover_is_this_attempts_not_earlier_runs(tmp_path):
    path = journal(tmp_path / "events.jsonl", [E.Start(T0, 1, 10, "A"), *attempt(T0 + 5, 30.0, 60)])
    history = RateHistory(tmp_path / "rates.json")
    history.record("job", "A", 12.0, T0 - 86400)  # what an earlier run of the preset measured
    fresh = Projector(preset="A", cost_per_hour=3.6, history=RateHistory(tmp_path / "rates.json"), job="job")
    taken = Projector(preset="A", cost_per_hour=3.6, history=history, job="job")
    projector_catches_up(taken, path)
    assert history.rate("job", "A") == 12.0  # the earlier agent wrote this attempt's: not again
    now = T0 + 70
    live = E.Progress(now, 1, 1, 1 + round(65 * 30.0), 100_000)
    fresh.on_event(live)
    taken.on_event(live)
    p = taken.project(now)
    assert (p.rate, p.rate_source) == (pytest.approx(30.0, rel=0.05), "measured")
    assert (fresh.project(now).rate, fresh.project(now).rate_source) == (12.0, "history")  # without
    assert p.cost_so_far == pytest.approx(70 / 3600 * 3.6)  # from the run's first start
    assert fresh.project(now).cost_so_far == pytest.approx(0.0)  # without: from the takeover


def test_a_two_rank_journal_gives_one_ranks_rate(tmp_path):
    events: list[E.Event] = [E.Start(T0, 1, 10, "A")]
    for a, b in zip(attempt(T0 + 5, 20.0, 40, rank=0), attempt(T0 + 5.5, 20.0, 40, rank=1), strict=True):
        events += [a, b]
    pj = Projector(preset="A")
    projector_catches_up(pj, journal(tmp_path / "events.jsonl", events))
    assert pj.project(T0 + 46).rate == pytest.approx(20.0, rel=0.05)


def test_no_journal_is_a_fresh_projection(tmp_path):
    pj = Projector(preset="A")
    projector_catches_up(pj, tmp_path / "missing.jsonl")
    assert pj.project(T0) is None
