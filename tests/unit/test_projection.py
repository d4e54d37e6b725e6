"""The projection: the seeds' hand arithmetic, edge cases, the at-risk warning, the rate
history, and replays of recorded real runs (tests/data/runs/)."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path

import pytest

from trainctl.core import events as E
from trainctl.core.projection import Projector
from trainctl.core.projection_text import format_projection, format_what_if, humanize_duration
from trainctl.core.rates import RateHistory, RateMeter
from trainctl.core.risk import REARM_S
from trainctl.store.journal import read_events

pytestmark = pytest.mark.timeout(30)

RUNS = Path(__file__).resolve().parent.parent / "data" / "runs"
BATCHES, EPOCHS = 41_163, 50  # the seeds' run
TOTAL = BATCHES * EPOCHS
T0 = dt.datetime(2025, 11, 14, 22, 5).timestamp()  # "Nov 14, 10:05 PM: training started"
DEADLINE = dt.datetime(2025, 11, 30, 0, 0).timestamp()
COST_PER_HOUR = 1.57


def local_day(ts: float) -> tuple[int, int]:
    t = time.localtime(ts)
    return t.tm_mon, t.tm_mday


def feed_steady(
    pj: Projector,
    t: float,
    epoch: int,
    batch: int,
    rate: float,
    n: int,
    every_s: float = 10.0,
    batches: int = BATCHES,
    epochs: int = EPOCHS,
) -> tuple[float, int]:
    """n progress events, every `every_s` seconds, `rate * every_s` batches apart (one epoch);
    returns the last (ts, batch)."""
    step = round(rate * every_s)
    for _ in range(n):
        pj.on_event(E.Progress(t, epoch, epochs, batch, batches))
        t += every_s
        batch += step
    return t - every_s, batch - step


# ---------------------------------------------------------------------------- the seeds
def test_seeds_a_versus_b_arithmetic():
    """2.4 it/s -> Nov 24; B (workers=0, 2.1 it/s) -> Nov 26 with days of buffer; cost at $1.57/h."""
    pj = Projector(
        deadline=DEADLINE,
        cost_per_hour=COST_PER_HOUR,
        budget=500.0,
        preset="A",
        expected_rates={"A": 2.4, "B": 2.1},
    )
    pj.on_event(E.Start(T0, 1, 100, "A"))
    startup = 60.0
    t_last, b_last = feed_steady(pj, T0 + startup, 1, 24, 2.4, 61)
    assert (t_last, b_last) == (T0 + 660.0, 24 + 24 * 60)
    p = pj.project(t_last)

    assert p.rate == pytest.approx(2.4, rel=1e-12)
    eta_a = t_last + (TOTAL - b_last) / 2.4
    assert p.eta == pytest.approx(eta_a, abs=1e-3)
    assert local_day(p.eta) == (11, 24)  # "complete Nov 24-25"
    assert p.buffer_s == pytest.approx(DEADLINE - eta_a, abs=1e-3)
    assert p.cost_so_far == pytest.approx(660.0 / 3600 * 1.57)
    assert p.cost_at_eta == pytest.approx((eta_a - T0) / 3600 * 1.57, rel=1e-9)
    assert p.eta_low == pytest.approx(eta_a) and p.eta_high == pytest.approx(eta_a)
    assert p.budget == 500.0

    (b,) = p.what_if  # every OTHER known preset
    # A measured at its declared 2.4: B's declared 2.1 scaled by 2.4 / 2.4
    assert (b["preset"], b["rate"], b["source"], b["declared"]) == ("B", 2.1, "scaled", 2.1)
    eta_b = t_last + startup + TOTAL / 2.1  # restart now, from batch 0
    assert b["eta"] == pytest.approx(eta_b, abs=1e-3)
    assert local_day(b["eta"]) == (11, 26)  # "Complete: Nov 26"
    assert b["buffer_s"] == pytest.approx(DEADLINE - eta_b, abs=1e-3)
    assert 3 * 86400 < b["buffer_s"] < 4 * 86400  # "~4 days before deadline"
    assert b["cost_at_eta"] == pytest.approx((eta_b - T0) / 3600 * 1.57, rel=1e-9)

    lines = format_projection(p, t_last)
    assert lines[0].startswith("ETA Nov 24 ") and "(in 9 d 22 h)" in lines[0] and "2.40 it/s" in lines[0]
    assert lines[1] == f"deadline Nov 30 00:00: buffer +{humanize_duration(DEADLINE - eta_a)}"
    assert (
        lines[2] == f"cost $0.29 so far, ${(eta_a - T0) / 3600 * 1.57:,.0f} at ETA; budget $500 "
        f"(${500 - (eta_a - T0) / 3600 * 1.57:,.0f} to spare)"
    )
    assert lines[-1].startswith("B (~2.1 it/s: declared 2.1, scaled to A's measured): ETA Nov 26 ")
    assert f"buffer +{humanize_duration(DEADLINE - eta_b)}" in lines[-1]


def test_seeds_eight_hours_lost_to_a_hang_then_restart_from_checkpoint():
    """Hang at batch 4,886 of epoch 2 found 8 h later, then a restart from the epoch-1
    checkpoint: the ETA counts the redone part of epoch 2 and the learned start-up; what was
    lost is the goodput's figure (core/goodput.py), the one 'lost' a person sees."""
    pj = Projector(cost_per_hour=COST_PER_HOUR, budget=15.0, preset="B", expected_rates={"A": 2.4, "B": None})
    pj.on_event(E.Start(T0, 1, 100, "B"))
    pj.on_event(E.Checkpoint(T0 + 1, "/run/last.pt", 1))  # a resumed run: epoch 1 done
    t_hang, batch = feed_steady(pj, T0 + 30.0, 2, 4886 - 24 * 60, 2.4, 61)
    assert batch == 4886
    stall_at = t_hang + 8 * 3600
    pj.on_event(E.Stall(stall_at, "train", 8 * 3600, "deadlock"))
    pj.on_event(E.Exit(stall_at + 2, -9, "SIGKILL"))
    pj.on_event(E.Restart(stall_at + 3, 2, "stall", "B", "/run/last.pt"))
    p = pj.project(stall_at + 3)
    assert p.rate == pytest.approx(2.4)  # the preset's rate survives
    # in the new attempt's startup: startup (30 s, learned) + all of epochs 2..50 at 2.4 it/s
    assert p.eta == pytest.approx(stall_at + 3 + 30 + (TOTAL - BATCHES) / 2.4, abs=1e-3)

    pj.on_event(E.Start(stall_at + 4, 2, 101, "B"))
    t, b = feed_steady(pj, stall_at + 34, 2, 24, 2.4, 205)  # past batch 4886 again
    assert b >= 4886
    p = pj.project(t)
    assert p.redone == (4886 - 23,)  # resumed at batch 24 of epoch 2: 23 .. 4886 again
    assert p.cost_so_far == pytest.approx((t - T0) / 3600 * COST_PER_HOUR)  # all attempts
    assert pj.at_risk(t).id == "budget.at_risk"  # $15 of credit is far too little
    assert not any("lost" in line for line in format_projection(p, t))


# ---------------------------------------------------------------------------- edge cases
def test_an_open_step_counter_has_a_rate_a_checkpoint_position_and_batches_redone():
    """nanoGPT's ``iter N: loss X``: a step with no epoch and no count.  No total (no ETA),
    but a rate, the checkpoint's position on that counter ("step 2000"), the batches a
    restart from it redoes, and those it did redo once resumed."""
    pj = Projector()
    pj.on_event(E.Start(T0, 1, 100, None))
    for i in range(1, 41):
        pj.on_event(E.Progress(T0 + i * 0.5, None, None, i * 50, None, {"loss": 1.0}))
        if i == 20:
            pj.on_event(E.Checkpoint(T0 + i * 0.5, "/w/out/ckpt.pt", None, batch=1000, kind="script"))
    assert pj.redone_since_checkpoint() == 2000 - 1000
    p = pj.project(T0 + 20.0)
    assert p.rate == pytest.approx(100.0) and p.eta is None  # 50 steps every 0.5 s; no total
    assert p.checkpoint is not None and p.checkpoint["lose"] == 1000
    assert "step 1000" in " ".join(format_projection(p, T0 + 20.0))
    pj.on_event(E.Restart(T0 + 25, 2, "stall", None, "/w/out/ckpt.pt"))
    pj.on_event(E.Start(T0 + 26, 2, 101, None))
    pj.on_event(E.Progress(T0 + 30, None, None, 1001, None, {"loss": 1.0}))
    assert pj.project(T0 + 30).redone == (2000 - 1000,)  # 1001 .. 2000 again


def test_nothing_seen_yet_and_no_rate_yet():
    pj = Projector(deadline=DEADLINE, cost_per_hour=1.0)
    assert pj.project(T0) is None
    assert pj.at_risk(T0) is None
    pj.on_event(E.Start(T0, 1, 1, "A"))
    p = pj.project(T0 + 3600)
    assert (p.eta, p.buffer_s, p.rate, p.cost_at_eta) == (None, None, None, None)
    assert p.cost_so_far == pytest.approx(1.0)
    pj.on_event(E.Progress(T0 + 10, 1, 2, 1, 100))  # one point: no interval yet
    p = pj.project(T0 + 11)
    assert p.eta is None and p.rate is None
    assert format_projection(p, T0 + 11)[0] == "ETA unknown: no rate yet"
    assert pj.at_risk(T0 + 11) is None


def test_rate_zero_gives_no_eta():
    pj = Projector(preset="A", expected_rates={"A": None, "B": 0.0})
    pj.on_event(E.Start(T0, 1, 1, "A"))
    for i in range(60):  # the counter never moves
        pj.on_event(E.Progress(T0 + 10 * i, 1, 5, 7, 100))
    p = pj.project(T0 + 600)
    assert p.rate is None and p.eta is None and p.buffer_s is None
    assert p.what_if == ()  # no rate: no what-if
    pj2 = Projector(preset="A", expected_rates={"A": None, "B": 0.0})
    feed_steady(pj2, T0, 1, 1, 1.0, 10, every_s=10.0, batches=1000, epochs=2)
    (b,) = pj2.project(T0 + 100).what_if
    assert b == {
        "preset": "B",
        "rate": None,
        "source": "unknown",
        "eta": None,
        "buffer_s": None,
        "cost_at_eta": None,
    }
    assert format_what_if(b, T0) == "B (rate unknown): no ETA"


def test_unknown_total():
    pj = Projector()
    for i in range(10):  # epochs unknown
        pj.on_event(E.Progress(T0 + i, 3, None, 10 * i + 1, 1000))
    p = pj.project(T0 + 10)
    assert p.rate == pytest.approx(10.0) and p.eta is None
    assert format_projection(p, T0 + 10)[0] == "ETA unknown: total work unknown at 10.00 it/s"
    pj = Projector()
    for i in range(10):  # batches unknown
        pj.on_event(E.Progress(T0 + i, 1, 5, 10 * i + 1, None))
    assert pj.project(T0 + 10).eta is None
    pj = Projector()  # one unlabelled pass: steps/total
    for i in range(10):
        pj.on_event(E.Progress(T0 + i, None, None, 10 * i + 1, 1000))
    assert pj.project(T0 + 9).eta == pytest.approx(T0 + 9 + (1000 - 91) / 10.0)
    pj.on_event(E.Progress(T0 + 10, None, None, 5, 1000))  # ...that restarted by itself
    assert pj.project(T0 + 10).eta is None


def test_past_deadline_is_late_and_warned():
    pj = Projector(deadline=T0 - 3600, preset="A")
    pj.on_event(E.Start(T0, 1, 1, "A"))
    t, _ = feed_steady(pj, T0, 1, 1, 2.0, 20, batches=10_000, epochs=1)
    p = pj.project(t)
    assert p.buffer_s < 0 and p.buffer_s == pytest.approx(p.deadline - p.eta)
    assert format_projection(p, t)[1].endswith("(late)")
    w = pj.at_risk(t)
    assert w.id == "deadline.at_risk" and w.severity == "warning" and "is after the deadline" in w.text


def test_resumed_run_and_epoch_rollover_never_give_a_negative_rate():
    pj = Projector(preset="A")
    pj.on_event(E.Start(T0, 1, 1, "A"))
    t = T0
    for epoch in (12, 13):  # a resumed run starts at epoch 12
        for b in range(10, 101, 10):
            t += 1.0
            pj.on_event(E.Progress(t, epoch, 20, b, 100))
    p = pj.project(t)
    assert p.rate == pytest.approx(10.0)
    assert p.eta == pytest.approx(t + 7 * 100 / 10.0 + 7 * 0.0)  # rollover took no extra time
    pj.on_event(E.Progress(t + 1, 13, 20, 3, 100))  # the counter went back, no restart
    pj.on_event(E.Progress(t + 2, 13, 20, 13, 100))
    assert pj.project(t + 2).rate > 0


def test_restart_keeps_the_preset_rate_then_uses_the_new_attempt():
    pj = Projector(preset="A", expected_rates={"A": 1.0, "B": None})
    pj.on_event(E.Start(T0, 1, 1, "A"))
    t, _ = feed_steady(pj, T0 + 5, 1, 10, 4.0, 40, batches=100_000, epochs=1)
    assert pj.project(t).rate == pytest.approx(4.0)
    pj.on_event(E.Restart(t + 1, 2, "stall", "A", None))  # no resume: from scratch
    pj.on_event(E.Start(t + 2, 2, 2, "A"))
    p = pj.project(t + 3)
    assert p.rate == pytest.approx(4.0)  # measured beats declared 1.0
    assert p.eta == pytest.approx(t + 3 + (5 - 1) + 100_000 / 4.0)  # startup 5 s learned
    t2, _ = feed_steady(pj, t + 7, 1, 10, 3.0, 3, batches=100_000, epochs=1)
    assert pj.project(t2).rate == pytest.approx(4.0)  # 2 intervals: not trusted yet
    t3, _ = feed_steady(pj, t2 + 10, 1, 100, 3.0, 10, batches=100_000, epochs=1)
    assert pj.project(t3).rate == pytest.approx(3.0)


def test_what_if_prefers_measured_over_declared(tmp_path):
    hist = RateHistory(tmp_path / "rates.json")
    hist.record("yolo", "B", 2.05, T0 - 86400)
    pj = Projector(
        deadline=DEADLINE, preset="A", expected_rates={"A": 2.4, "B": 2.1, "C": 3.0}, history=hist, job="yolo"
    )
    pj.on_event(E.Start(T0, 1, 1, "A"))
    t, _ = feed_steady(pj, T0, 1, 24, 2.4, 10)
    items = {w["preset"]: w for w in pj.project(t).what_if}
    assert (items["B"]["rate"], items["B"]["source"]) == (2.05, "history")
    assert (items["C"]["rate"], items["C"]["source"]) == (pytest.approx(3.0), "scaled")
    assert format_what_if(items["B"], t).startswith("B (measured 2.05 it/s in earlier runs): ETA ")


def test_measured_in_this_run_beats_history_and_is_recorded(tmp_path):
    hist = RateHistory(tmp_path / "rates.json")
    hist.record("job", "B", 1.0, T0 - 86400)
    pj = Projector(preset="B", expected_rates={"A": 9.0, "B": 5.0}, history=hist, job="job")
    pj.on_event(E.Start(T0, 1, 1, "B"))
    t, _ = feed_steady(pj, T0, 1, 20, 2.0, 12, batches=1000, epochs=3)
    pj.on_event(E.Restart(t + 1, 2, "switch", "A", "/x/last.pt"))
    pj.on_event(E.Start(t + 2, 2, 2, "A"))
    t2, _ = feed_steady(pj, t + 5, 1, 20, 3.0, 12, batches=1000, epochs=3)
    (b,) = pj.project(t2).what_if
    assert (b["preset"], b["rate"], b["source"]) == ("B", pytest.approx(2.0), "measured")
    assert RateHistory(tmp_path / "rates.json").rate("job", "B") == pytest.approx(1.5)  # median(1, 2)


def test_a_pause_does_not_move_the_rate_but_a_slowdown_does():
    pj = Projector(preset="A")
    t, b = feed_steady(pj, T0, 1, 10, 5.0, 15, batches=100_000, epochs=1)
    t, b = feed_steady(pj, t + 60, 1, b + 50, 5.0, 15, batches=100_000, epochs=1)  # a 60 s pause
    assert pj.project(t).rate == pytest.approx(5.0, rel=0.02)
    t, b = feed_steady(pj, t + 10, 1, b + 25, 2.5, 40, batches=100_000, epochs=1)  # 400 s slower
    p = pj.project(t)
    assert p.rate == pytest.approx(2.5, rel=0.02)


def test_band_from_the_spread_of_recent_rates():
    meter = RateMeter(300.0)
    t, g = T0, 0
    for i in range(120):  # alternating 2.0 / 3.0 it/s
        dt_ = 10.0
        g += 20 if (i // 6) % 2 == 0 else 30
        t += dt_
        meter.add(t, g)
    est = meter.estimate()
    assert 2.0 <= est.low < est.rate < est.high <= 3.0
    pj = Projector(deadline=T0 + 10**6)
    g = 0
    for i in range(60):  # blocks of 2.0 and 3.0 it/s
        g += 20 if (i // 6) % 2 == 0 else 30
        pj.on_event(E.Progress(T0 + 10 * i, 1, 1, g, 100_000))
    p = pj.project(T0 + 590)
    assert p.eta_low < p.eta < p.eta_high
    assert p.eta_high - p.eta_low > 0.2 * (p.eta - T0)  # a real spread, not rounding


def test_epoch_overhead_is_learned_from_rollovers_and_phases():
    pj = Projector(preset="A")
    pj.on_event(E.Start(T0, 1, 1, "A"))
    t = T0 + 5
    for b in range(10, 101, 10):  # epoch 1: 10 it/s
        pj.on_event(E.Progress(t, 1, 4, b, 100))
        t += 1.0
    t_val = t - 1.0
    pj.on_event(E.Phase(t_val + 0.5, "val"))
    p = pj.project(t_val + 0.5)
    assert p.eta == pytest.approx(t_val + 300 / 10.0)  # nothing learned about val yet
    pj.on_event(E.Phase(t_val + 20, "save"))
    pj.on_event(E.Phase(t_val + 25, "train"))
    p = pj.project(t_val + 25)  # from the phases: 20 + 5 s
    assert p.eta == pytest.approx(t_val + 25 + 300 / 10.0 + 3 * 25.0)
    pj.on_event(E.Progress(t_val + 26, 2, 4, 10, 100))  # rollover: 26 s - 10 batches
    pj.on_event(E.Progress(t_val + 27, 2, 4, 20, 100))
    p = pj.project(t_val + 27)
    assert p.eta == pytest.approx(t_val + 27 + 280 / 10.0 + 3 * 25.0)


def test_other_ranks_are_ignored():
    pj = Projector()
    for i in range(10):
        pj.on_event(E.Progress(T0 + i, 1, 1, 10 * i + 1, 1000, rank=0))
        pj.on_event(E.Progress(T0 + i, 1, 1, 1, 1000, rank=1))
    assert pj.project(T0 + 9).rate == pytest.approx(10.0)


# ---------------------------------------------------------------------------- at risk
def test_at_risk_once_not_every_tick_and_rearmed_after_clearly_safe():
    late = T0 + 3 * 86400
    pj = Projector(deadline=late, preset="A", expected_rates={"A": None, "B": 4.0})
    pj.on_event(E.Start(T0, 1, 1, "A"))
    t, b = feed_steady(pj, T0, 1, 10, 1.0, 31, batches=300_000, epochs=1)  # ~3.5 d at 1 it/s
    warnings = []
    for _ in range(120):  # an hour of 30 s ticks
        t += 30
        b += 30
        pj.on_event(E.Progress(t, 1, 1, b, 300_000))
        w = pj.at_risk(t)
        if w is not None:
            warnings.append(w)
    assert [w.id for w in warnings] == ["deadline.at_risk"]
    assert " is after the deadline " in warnings[0].text
    assert "; B would finish " in warnings[0].text and "to spare" in warnings[0].text
    assert warnings[0].text.endswith("(at its declared rate, not measured here)")
    assert "preset B" in warnings[0].advice and warnings[0].source == "trainctl"
    pj.deadline = late + 5 * 86400  # safe, but not for long...
    assert all(pj.at_risk(t + 30 * i) is None for i in range(1, 10))
    pj.deadline = late  # ...late again: still quiet
    assert pj.at_risk(t + 300) is None
    pj.deadline = late + 5 * 86400  # clearly safe for REARM_S...
    for i in range(1, int(REARM_S / 30) + 2):
        assert pj.at_risk(t + 300 + 30 * i) is None
    pj.deadline = late  # ...then late again: re-armed
    assert pj.at_risk(t + 300 + REARM_S + 120).id == "deadline.at_risk"


def test_at_risk_band_crossing_with_hysteresis_no_flapping():
    """An ETA hovering around the deadline warns once; a brief dip under it does not re-arm."""
    pj = Projector(preset="A")
    pj.on_event(E.Start(T0, 1, 1, "A"))
    t, _ = feed_steady(pj, T0, 1, 10, 1.0, 31, batches=100_000, epochs=1)
    eta = pj.project(t).eta
    fired = 0
    for i in range(40):
        pj.deadline = eta + (-60 if i % 2 else 60)  # flapping across it
        fired += pj.at_risk(t) is not None
    assert fired == 1


def test_budget_at_risk_and_both_at_once():
    pj = Projector(deadline=T0 + 3600, cost_per_hour=1.57, budget=2.0, preset="A")
    pj.on_event(E.Start(T0, 1, 1, "A"))
    t, _ = feed_steady(pj, T0, 1, 10, 1.0, 31, batches=100_000, epochs=1)
    first, second, third = pj.at_risk(t), pj.at_risk(t + 30), pj.at_risk(t + 60)
    assert (first.id, second.id, third) == ("deadline.at_risk", "budget.at_risk", None)
    assert "is over the budget $2.00" in second.text


# ---------------------------------------------------------------------------- history
def test_rate_history_round_trip_and_atomic(tmp_path):
    path = tmp_path / "sub" / "rates.json"
    h = RateHistory(path)
    assert h.rate("job", "A") is None
    for i, r in enumerate((2.0, 2.2, 2.4, 2.6, 2.8, 10.0)):
        assert h.record("job", "A", r, T0 + i)
    assert RateHistory(path).rate("job", "A") == pytest.approx(2.6)  # median of the last 5
    assert RateHistory(path).rate("job", "B") is None
    assert RateHistory(path).rate("other", "A") is None
    assert sorted(os.listdir(path.parent)) == ["rates.json"]  # no temp file left
    assert json.loads(path.read_text())["jobs"]["job"]["A"][-1] == {"rate": 10.0, "ts": T0 + 5}
    for i in range(30):
        h.record("job", "A", 1.0, T0 + 10 + i)
    assert len(json.loads(path.read_text())["jobs"]["job"]["A"]) == RateHistory.KEEP


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"\xff\xfe\x00garbage",
        b"[1, 2]",
        b'{"jobs": []}',
        b'{"jobs": {"job": {"A": "x"}}}',
        b'{"jobs": {"job": {"A": [{"rate": "fast"}, 7, {"rate": NaN}, {"rate": -1}, {"rate": 3.0}]}}}',
    ],
)
def test_rate_history_survives_a_corrupt_file(tmp_path, content):
    path = tmp_path / "rates.json"
    path.write_bytes(content)
    h = RateHistory(path)
    assert h.rate("job", "A") in (None, 3.0)
    assert h.record("job", "A", 2.0, T0)
    assert RateHistory(path).rate("job", "A") in (2.0, 2.5)
    json.loads(path.read_text())


def test_rate_history_unwritable_is_not_fatal(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    h = RateHistory(blocker / "rates.json")  # parent is a file
    assert h.record("job", "A", 2.0, T0) is False
    assert h.rate("job", "A") == 2.0  # still remembered in memory


# ---------------------------------------------------------------------------- text
@pytest.mark.parametrize(
    "s,text",
    [
        (0, "0 s"),
        (45.4, "45 s"),
        (200, "3 m 20 s"),
        (120, "2 m"),
        (3 * 3600 + 59, "3 h 1 m"),
        (5 * 3600 + 12 * 60, "5 h 12 m"),
        (2 * 86400 + 3 * 3600 + 600, "2 d 3 h"),
        (86400, "1 d"),
        (-(86400 + 14 * 3600), "-1 d 14 h"),
        (None, "?"),
    ],
)
def test_humanize_duration(s, text):
    assert humanize_duration(s) == text


def test_format_what_if_line():
    now = dt.datetime(2025, 11, 20, 12, 0).timestamp()
    eta = dt.datetime(2025, 11, 26, 3, 0).timestamp()
    w = {
        "preset": "B",
        "rate": 2.1,
        "source": "measured",
        "eta": eta,
        "buffer_s": 3 * 86400 + 21 * 3600,
        "cost_at_eta": 412.3,
    }
    assert format_what_if(w, now) == "B (measured 2.1 it/s): ETA Nov 26 03:00, buffer +3 d 21 h, cost $412"


def test_projection_event_round_trips_and_an_old_one_with_lost_s_still_reads():
    p = E.Projection(T0, T0 + 10, None, None, 2.0, 1.0, 2.0, what_if=({"preset": "B", "rate": None},))
    assert E.decode(E.encode(p)) == p
    old = E.to_dict(p) | {"lost_s": 28800.0}  # journals before the goodput's one figure
    assert E.from_dict(old) == p


# ---------------------------------------------------------------------------- recorded runs
def replay_at(path: Path, fraction: float) -> tuple[float, float, float, E.Projection]:
    """(start, actual end, when, projection) at the first progress past `fraction` of the work."""
    events = list(read_events(path))
    start = next(ev.ts for ev in events if isinstance(ev, E.Start))
    end = next(ev.ts for ev in events if isinstance(ev, E.Phase) and ev.phase == "finished")
    pj, made = Projector(), None
    for ev in events:
        pj.on_event(ev)
        if (
            made is None
            and isinstance(ev, E.Progress)
            and (ev.epoch - 1) * ev.batches + ev.batch >= fraction * ev.epochs * ev.batches
        ):
            made = (ev.ts, pj.project(ev.ts))
    return start, end, made[0], made[1]


@pytest.mark.parametrize("name,fraction", [("yolo_cpu.jsonl", 0.2), ("torch_restart.jsonl", 0.6)])
def test_recorded_runs_eta_within_ten_percent(name, fraction):
    start, end, when, p = replay_at(RUNS / name, fraction)
    assert p.rate > 0 and p.eta > when
    assert abs(p.eta - end) <= 0.10 * (end - start)


def test_recorded_restart_run_projects_its_end():
    events = list(read_events(RUNS / "torch_restart.jsonl"))
    pj = Projector()
    rates = []
    for ev in events:
        pj.on_event(ev)
        if isinstance(ev, E.Progress):
            rates.append(pj.project(ev.ts).rate)
    stall = next(ev for ev in events if isinstance(ev, E.Stall))
    restart_start = [ev for ev in events if isinstance(ev, E.Start)][1]
    end = events[-1].ts
    p = pj.project(end)
    assert all(r is None or r > 0 for r in rates)
    assert p.eta == pytest.approx(next(ev.ts for ev in events if getattr(ev, "phase", "") == "finished"))
    assert format_projection(p, end + 7200)[0].startswith("finished ")
    assert "(2 h ago)" in format_projection(p, end + 7200)[0]
    assert stall.ts < restart_start.ts and p.redone  # resumed: the redone batches counted


def test_a_finished_run_reads_as_finished_with_one_cost():
    p = E.Projection(
        T0 + 100,
        eta=T0 + 100,
        deadline=T0 + 3600,
        buffer_s=3500,
        rate=2.0,
        cost_so_far=0.05,
        cost_at_eta=0.05,
        budget=5.0,
        finished=True,
    )
    lines = format_projection(p, T0 + 160)
    assert lines[0].startswith("finished ") and "(1 m ago)" in lines[0], lines
    assert "cost $0.05 in all; budget $5.00 ($4.95 to spare)" in lines, lines
    live = E.Projection(
        T0 + 100,
        eta=T0 + 200,
        deadline=None,
        buffer_s=None,
        rate=2.0,
        cost_so_far=0.05,
        cost_at_eta=0.10,
        budget=None,
    )
    assert format_projection(live, T0 + 100)[1] == "cost $0.05 so far, $0.10 at ETA"
    # All the work done but no exit yet (validation, the final save): still an ETA.
    done = E.Projection(
        T0 + 100,
        eta=T0 + 100,
        deadline=None,
        buffer_s=None,
        rate=2.0,
        cost_so_far=0.05,
        cost_at_eta=0.05,
        budget=None,
    )
    assert format_projection(done, T0 + 100)[0].startswith("ETA "), format_projection(done, T0 + 100)


def test_headless_lines_for_a_projection_say_eta_with_time_left_or_the_end():
    from trainctl.core.printer import format_event

    live = E.Projection(
        T0, eta=T0 + 5400, deadline=T0 + 9000, buffer_s=3600, rate=2.4, cost_so_far=1.0, cost_at_eta=3.0
    )
    line = format_event(live)
    assert " ETA    " in line and "(in 1 h 30 m at 2.40 it/s), buffer +1 h" in line, line
    end = E.Projection(
        T0 + 60,
        eta=T0 + 60,
        deadline=None,
        buffer_s=None,
        rate=2.4,
        cost_so_far=1.25,
        cost_at_eta=1.25,
        finished=True,
    )
    line = format_event(end)
    assert " END    " in line and line.endswith(", cost $1.25"), line


def test_a_slurm_time_limit_is_a_deadline_within_each_job():
    """Work that would end 100 s from now, in a job that stops in 30 s: 70 s left for next
    jobs of 40 s each (two of them), each after a 20 s queue wait and start."""
    from trainctl.core.projection import across_jobs

    assert across_jobs(0.0, 100.0, 30.0, 40.0, 20.0) == 30.0 + 2 * 20.0 + 70.0
    assert across_jobs(0.0, 25.0, 30.0, 40.0, 20.0) == 25.0  # ends inside this job
    assert across_jobs(0.0, 100.0, None, None, 0.0) == 100.0  # no limit
    assert across_jobs(50.0, 100.0, 30.0, 40.0, 20.0) == 50.0 + 2 * 20.0 + 50.0  # past its end: saving


def test_the_projector_counts_the_jobs_a_slurm_run_still_needs():
    from trainctl.core import events as E
    from trainctl.core.projection import Projector

    p = Projector()
    p.on_event(E.Start(0.0, 1, 1, None))
    for i in range(1, 11):
        p.on_event(E.Progress(float(i), 1, 1, i, 100))  # 1 batch/s: 90 s of work left at t=10
    free = p.project(10.0).eta
    p.job_end, p.job_span_s, p.job_gap_s, p.job_gap_measured = 40.0, 50.0, 15.0, True
    limited = p.project(10.0).eta
    assert free == pytest.approx(100.0, abs=2)
    assert limited == pytest.approx(free + 2 * 15.0, abs=0.5)  # 60 s after job_end: two more jobs
    p.job_gap_measured = False  # a queue wait alone: each job's start (here 1 s) is added
    assert p.project(10.0).eta == pytest.approx(free + 2 * 16.0, abs=0.5)


# ---------------------------------------------------------------------------- measured before declared
def test_a_declared_rate_is_said_and_gives_way_to_the_first_measured_batches():
    """Batch 1: nothing measured, the preset's declared 2.4 it/s, said as declared; two
    intervals later the run's own 14 it/s (not 2.4); a what-if on B's declared 2.1 is
    scaled to A's measured rate, so the slower preset never looks faster."""
    pj = Projector(deadline=DEADLINE, preset="A", expected_rates={"A": 2.4, "B": 2.1})
    pj.on_event(E.Start(T0, 1, 100, "A"))
    pj.on_event(E.Progress(T0 + 5, 1, 3, 1, 1000))
    p = pj.project(T0 + 5)
    assert (p.rate, p.rate_source, p.preset) == (2.4, "declared", "A")
    assert "2.40 it/s (declared by preset A, not measured yet)" in format_projection(p, T0 + 5)[0]
    (b,) = p.what_if
    assert (b["source"], b["rate"]) == ("declared", 2.1)  # both declared: comparable
    for i in range(1, 3):
        pj.on_event(E.Progress(T0 + 5 + i, 1, 3, 1 + 14 * i, 1000))
    p = pj.project(T0 + 7)
    assert (p.rate, p.rate_source) == (pytest.approx(14.0), "measured")
    assert format_projection(p, T0 + 7)[0].endswith("at 14.00 it/s")
    (b,) = p.what_if
    assert b["source"] == "scaled" and b["rate"] == pytest.approx(2.1 / 2.4 * 14.0)
    assert b["eta"] > p.eta  # slower is later, as measured


def test_a_finished_run_reports_what_it_measured_not_a_declared_rate():
    """A ran at 14 it/s, fell back to B for a few batches (too few to trust), finished:
    the end says 14 it/s measured, not B's declared 2.1 (`trainctl status` after a run)."""
    pj = Projector(preset="A", expected_rates={"A": 2.4, "B": 2.1})
    pj.on_event(E.Start(T0, 1, 1, "A"))
    t, b = feed_steady(pj, T0 + 2, 1, 10, 14.0, 20, every_s=1.0, batches=600, epochs=1)
    pj.on_event(E.Stall(t + 30, "train", 30, "deadlock"))
    pj.on_event(E.Exit(t + 31, -9, "SIGKILL"))
    pj.on_event(E.Restart(t + 32, 2, "stall", "B", None))
    pj.on_event(E.Start(t + 33, 2, 2, "B"))
    pj.on_event(E.Progress(t + 35, 1, 1, 600, 600))
    pj.on_event(E.Phase(t + 36, "finished"))
    pj.on_event(E.Exit(t + 37, 0))
    p = pj.project(t + 100)
    assert p.finished and p.rate == pytest.approx(14.0) and p.rate_source == "measured"
    assert "2.10" not in format_projection(p, t + 100)[0]


def test_while_stalled_the_eta_is_frozen_and_marked_never_counted_down():
    """A stall: the ETA says how much work is left when the projection was made and that
    it moves later, instead of 'in 3 h' shrinking every second while nothing trains; the
    next batch ends the mark, and a new attempt starts without it."""
    pj = Projector(preset="A")
    pj.on_event(E.Start(T0, 1, 100, "A"))
    t_last, _ = feed_steady(pj, T0 + 30.0, 1, 1000, 2.4, 30)
    live = pj.project(t_last)
    assert live.stalled_since is None
    stall_at = t_last + 60
    pj.on_event(E.Stall(stall_at, "train", 60.0, "deadlock"))
    p = pj.project(stall_at)
    assert p.stalled_since == pytest.approx(t_last)
    left = p.eta - p.ts
    (line,) = [x for x in format_projection(p, stall_at + 600) if x.startswith("ETA")]
    assert line.startswith("ETA not before") and "stalled for 11 m" in line
    assert f"{humanize_duration(left)} of work left" in line
    # ten minutes later, from the same projection: the same work left, never 10 m less
    later = [x for x in format_projection(p, stall_at + 1200) if x.startswith("ETA")][0]
    assert f"{humanize_duration(left)} of work left" in later and "stalled for 21 m" in later
    pj.on_event(E.Progress(stall_at + 5, 1, EPOCHS, 1100, BATCHES))  # it recovered by itself
    assert pj.project(stall_at + 5).stalled_since is None
    pj.on_event(E.Stall(stall_at + 100, "train", 60.0, "deadlock"))
    pj.on_event(E.Restart(stall_at + 101, 2, "stall", "A", None))
    pj.on_event(E.Start(stall_at + 102, 2, 101, "A"))
    assert pj.project(stall_at + 102).stalled_since is None
