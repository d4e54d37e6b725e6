"""Pauses never blind the stall detector (issue 40, item 4), on virtual time: a gap that
healed by itself or ended a stall stays out of the train threshold, a silent evaluation
ended by its summary line is a phase of its own, learned where it recurs, and two slow
gaps in a row are the new batch time."""

from __future__ import annotations

import pytest

from trainctl.core.events import Progress
from trainctl.core.stall import StallDetector

pytestmark = pytest.mark.timeout(10)
BATCHES = 10_000  # one long epoch: no boundary in these tests


def batches(d: StallDetector, t: float, first: int, n: int, dt: float = 0.05) -> float:
    if d.phase != "train":
        d.on_phase("train", t)
    for b in range(first, first + n):
        t = round(t + dt, 6)
        d.on_progress(Progress(t, 1, 1, b, BATCHES, {"loss": 1.0}), t)
    return t


def caught_after(d: StallDetector, t: float, until: float = 900.0) -> float:
    """Seconds of a hang from ``t`` until the first verdict (checked every 0.25 s)."""
    for i in range(1, int(until * 4)):
        if d.check(t + i / 4) is not None:
            return i / 4
    raise AssertionError("the hang was never caught")


def test_a_20s_pause_that_heals_itself_leaves_the_threshold_as_it_was():
    d = StallDetector()
    t = batches(d, 0.0, 1, 50)
    before = d.threshold(t)
    assert before == 30.0
    t = batches(d, t + 20.0, 51, 1)  # 20 s without a batch, then training goes on
    t = batches(d, t, 52, 20)
    assert d.threshold(t) == before
    assert caught_after(d, t) <= before + 2


def test_any_number_of_self_healing_pauses_and_a_gap_that_ended_a_stall():
    d = StallDetector(floor=5.0)
    t = batches(d, 0.0, 1, 50, dt=0.5)
    before = d.threshold(t)  # 5 × 0.5 s
    n = 51
    for pause in (20.0, 3.0, 45.0):
        if pause > before:  # it passes the threshold: a verdict, then it recovers
            assert d.check(t + before + 1) is not None
        t = batches(d, t + pause, n, 1, dt=0.0)
        t = batches(d, t, n + 1, 5, dt=0.5)
        n += 6
    assert d.threshold(t) == before
    assert caught_after(d, t) <= before + 2


def test_a_silent_evaluation_every_n_steps_is_a_phase_of_its_own():
    d = StallDetector()
    t, n = 0.0, 1
    for _ in range(3):  # 20 batches, then a 14 s evaluation that prints only its summary
        t = batches(d, t, n, 20)
        n += 20
        d.on_other_line(t + 14.0)
        t = batches(d, t + 14.0, n, 1, dt=0.0)
        n += 1
    t = batches(d, t, n, 3)  # into the next stretch: the train threshold is untouched
    assert d.threshold(t) == 30.0 and "pause" not in d.explain(t)
    t = batches(d, t, n + 3, 17)  # 21 steps after the last pause (its period): where it pauses
    assert d.threshold(t) == pytest.approx(3 * 14.0) and "pause in training" in d.explain(t)
    assert d.check(t + 35.0) is None  # a 35 s evaluation there is no hang
    assert d.check(t + 43.0) is not None
    assert d.state_dict()["pause"] == [14.0, 14.0, 14.0]


def test_two_slow_gaps_in_a_row_are_the_new_batch_time():
    d = StallDetector(floor=5.0)
    t = batches(d, 0.0, 1, 50, dt=0.5)
    t = batches(d, t, 51, 2, dt=4.0)  # 8 × slower, twice: the trainer is now this slow
    assert d.threshold(t) == pytest.approx(5 * 4.0)
