"""The ladder's pure policy (core/ladder.py) on replayed histories and a fake clock."""

from __future__ import annotations

import pytest

from trainctl.config.ladder import worker_rungs
from trainctl.core import events as E
from trainctl.core.ladder import LadderPolicy
from trainctl.core.preset_risk import estimate

RUNGS = ("A4", "A2", "B")
RATES = (2.4, 2.2, 2.0)  # it/s, fastest first


def test_a_hang_steps_down_one_rung_and_stops_at_the_safest():
    lad = LadderPolicy(RUNGS, now=0.0)
    step = lad.on_hang(100.0, "deadlock")
    assert step is not None and (step.direction, step.from_rung, step.to_rung) == ("down", 0, 1)
    assert lad.preset == "A2" and "deadlock on A4" in step.reason
    assert lad.on_hang(200.0, "spin") is not None and lad.preset == "B"
    assert lad.on_hang(300.0, "crash") is None and lad.preset == "B"
    assert lad.stable_since == 300.0  # the stretch starts again even at the bottom


def test_no_step_up_before_the_stable_stretch_then_exactly_one():
    lad = LadderPolicy(RUNGS, now=0.0, stable_s=600.0, start=1)
    risks = (estimate(2.0, 1), estimate(5.0, 0), None)
    assert lad.consider_up(599.0, 100_000, RATES, risks) is None
    step = lad.consider_up(600.0, 100_000, RATES, risks)
    assert step is not None and step.direction == "up" and lad.preset == "A4"
    assert step.numbers["saved_s"] > step.numbers["extra_cost_s"]
    # at the top: nothing more to weigh
    assert lad.consider_up(1e9, 100_000, RATES, risks) is None


def test_never_more_than_one_step_up_per_stretch():
    lad = LadderPolicy(RUNGS, now=0.0, stable_s=600.0, start=2)
    risks = (estimate(10.0, 0), estimate(10.0, 0), estimate(10.0, 0))
    assert lad.consider_up(600.0, 1e6, RATES, risks) is not None and lad.preset == "A2"
    assert lad.consider_up(601.0, 1e6, RATES, risks) is None  # a new stretch began at 600
    assert lad.consider_up(1199.0, 1e6, RATES, risks) is None
    assert lad.consider_up(1200.0, 1e6, RATES, risks) is not None and lad.preset == "A4"


def test_a_step_up_that_does_not_pay_is_not_taken():
    # A4 hung 6 times in 1 h at ~5 min each: it costs more than its 10 % speed saves.
    lad = LadderPolicy(RUNGS, now=0.0, stable_s=60.0, start=1)
    risks = (estimate(1.0, 6, 6 * 300.0), estimate(3.0, 0), None)
    pay = lad.payoff(20_000, RATES, risks, None)
    assert pay is not None and not pay.pays
    assert lad.consider_up(3600.0, 20_000, RATES, risks) is None and lad.preset == "A2"
    assert "does not pay" in lad.describe(3600.0, pay)


def test_little_work_left_does_not_pay_either():
    lad = LadderPolicy(RUNGS, now=0.0, stable_s=60.0, start=1)
    risks = (estimate(2.0, 1, 120.0), estimate(2.0, 0), None)
    assert lad.consider_up(120.0, 50, RATES, risks) is None  # 50 batches: 2 s saved
    assert lad.consider_up(120.0, 500_000, RATES, risks) is not None


def test_no_step_up_within_the_last_stretch_before_the_deadline():
    lad = LadderPolicy(RUNGS, now=0.0, stable_s=600.0, start=1)
    risks = (estimate(5.0, 0), estimate(5.0, 0), None)
    assert lad.consider_up(700.0, 1e6, RATES, risks, deadline=1000.0) is None
    assert "deadline" in lad.describe(700.0, lad.payoff(1e6, RATES, risks, None), deadline=1000.0)
    assert lad.consider_up(700.0, 1e6, RATES, risks, deadline=1400.0) is not None


def test_default_stretch_is_the_longer_of_an_epoch_and_the_upper_rungs_mean_time_between_hangs():
    lad = LadderPolicy(RUNGS, now=0.0, start=1)
    a4 = estimate(9.0, 3)  # ~0.35/h: a hang every ~2.9 h
    assert lad.stretch_s(600.0, a4) == pytest.approx(a4.mean_time_between_h * 3600)
    assert lad.stretch_s(20_000.0, a4) == 20_000.0
    assert lad.stretch_s(600.0, None) == 600.0
    assert LadderPolicy(RUNGS, now=0.0, stable_s=30.0).stretch_s(600.0, a4) == 30.0


def test_a_pinned_rung_never_moves_until_unpinned():
    lad = LadderPolicy(RUNGS, now=0.0, stable_s=10.0)
    lad.pin("B", 5.0)
    assert lad.preset == "B" and lad.on_hang(6.0, "deadlock") is None and lad.preset == "B"
    assert lad.consider_up(1000.0, 1e6, RATES, (None, None, None)) is None
    assert "pinned" in lad.describe(1000.0)
    lad.unpin(1000.0)
    assert lad.consider_up(1010.0, 1e6, RATES, (None, None, None)) is not None and lad.preset == "A2"


def test_unknown_speed_waits_and_says_so():
    lad = LadderPolicy(RUNGS, now=0.0, stable_s=10.0, start=1)
    assert lad.consider_up(100.0, 1e6, (None, 2.2, 2.0), (None, None, None)) is None
    assert "waits for both rungs' speeds" in lad.describe(100.0, None)


def test_replayed_history_settles_on_the_fastest_stable_rung():
    """Replay: A4 hangs every ~20 min, A2 never; stretch 30 min. The ladder goes down to
    A2, tries A4 again once per stretch while it pays, and ends up on A2 once A4's learned
    rate makes the step not pay."""
    lad = LadderPolicy(RUNGS, now=0.0, stable_s=1800.0)
    hours = {"A4": 0.0, "A2": 0.0, "B": 0.0}
    hangs = {"A4": 0, "A2": 0, "B": 0}
    t, since, ups = 0.0, 0.0, 0
    while t < 40 * 3600:
        t += 60.0
        hours[lad.preset] += 60.0 / 3600
        if lad.preset == "A4" and t - since >= 1200.0:
            hangs["A4"] += 1
            lad.on_hang(t, "deadlock")
            since = t
            continue
        risks = tuple(estimate(hours[r], hangs[r], hangs[r] * 300.0) for r in RUNGS)
        if lad.consider_up(t, 50_000, RATES, risks) is not None:
            ups += 1
            since = t
    assert lad.preset == "A2"
    assert 1 <= ups <= 40 * 3600 / 1800  # at most one step up per stretch


def test_worker_rungs_and_the_event_round_trip():
    assert worker_rungs("A", [8, 4, 0]) == ("A.w8", "A.w4", "A.w0")
    ev = E.LadderMove(1.0, "down", "A4", "A2", 2, RUNGS, "deadlock on A4: one rung down", {"stable_s": 3.0})
    back = E.decode(E.encode(ev))
    assert back == ev and E.check(back) is back


# ---------------------------------------------------------------------- the job file


def _job(tmp_path, body: str):
    from trainctl.config import load_job

    (tmp_path / "presets").mkdir(exist_ok=True)
    for name, workers in (("A4", 4), ("A2", 2), ("B", 0)):
        (tmp_path / "presets" / f"{name}.toml").write_text(f"[dataloader]\nworkers = {workers}\n")
    path = tmp_path / "trainctl.toml"
    path.write_text('kind = "command"\ncommand = ["python", "-c", "pass"]\n' + body)
    return load_job(path)


def test_job_ladder_as_a_list_and_as_workers(tmp_path):
    from trainctl.config.ladder import rung_preset
    from trainctl.config.store import load_preset

    job = _job(tmp_path, 'ladder = ["A4", "A2", "B"]\n')
    assert job.ladder is not None and job.ladder.rungs == RUNGS and job.ladder.stable_s is None
    job = _job(tmp_path, 'preset = "A4"\n[ladder]\nworkers = [8, 4, 0]\nstable = "10s"\n')
    assert job.ladder is not None and job.ladder.rungs == ("A4.w8", "A4.w4", "A4.w0")
    assert job.ladder.stable_s == 10.0
    rung = rung_preset("A4.w0", lambda n: load_preset(n, [tmp_path / "presets"]))
    assert rung.name == "A4.w0" and rung.dataloader.workers == 0
    assert _job(tmp_path, "").ladder is None  # no ladder: as before


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('ladder = ["A4", "Nope"]\n', "Nope"),
        ("ladder = []\n", "fastest to the safest"),
        ('ladder = ["A4", "A4"]\n', "listed twice"),
        ('preset = "A4"\n[ladder]\npresets = ["A4"]\nworkers = [2, 0]\n', "not both"),
        ('preset = "A4"\n[ladder]\nworkers = [2, -1]\n', "worker count >= 0"),
        ("[ladder]\nworkers = [2, 0]\n", "needs the job's preset"),
        ('preset = "A4"\n[ladder]\nworkers = [2, 0]\nstable = "soon"\n', "stable"),
        ('preset = "B"\nladder = ["A4", "A2"]\n', "one of the ladder's rungs"),
        ("ladder = 3\n", "list of presets"),
    ],
)
def test_job_ladder_refused_with_a_clear_message(tmp_path, body, says):
    from trainctl.config import ConfigError

    with pytest.raises(ConfigError) as err:
        _job(tmp_path, body)
    assert says in str(err.value)


# ---------------------------------------------------------------------- alerts and memory


def test_a_step_down_joins_the_hangs_message_and_a_step_up_is_one_of_its_own():
    from trainctl.alerts.policy import AlertPolicy

    p = AlertPolicy("job", "box", "trainctl attach /runs/x")
    p.feed(E.Stall(1000.0, "train", 30.0, "deadlock", 0.0, None, 30.0, "worker"), 1000.0)
    p.feed(E.LadderMove(1003.0, "down", "A4", "A2", 2, RUNGS, "a deadlock on A4: one rung down"), 1003.0)
    p.feed(E.Restart(1004.0, 2, "the trainer stalled; ladder: one rung down to A2", "A2", None, 1.0), 1004.0)
    (hang,) = p.due(1004.5)
    assert "ladder: one rung down to A2 (2 of 3)" in hang.body and "ladder" in hang.kinds
    up = "A2 stable for 20 m; A4 saves 1 h over the remaining work, more than ...: one rung up"
    p.feed(E.LadderMove(3000.0, "up", "A2", "A4", 1, RUNGS, up, {"saved_s": 3600.0}), 3000.0)
    p.feed(E.Restart(3010.0, 3, "ladder: one rung up to A4", "A4", "/runs/x/last.pt"), 3010.0)
    (step_up,) = p.due(3100.0)
    assert "ladder up to A4" in step_up.title and up in step_up.body and step_up.kinds == ("ladder",)
    assert p.due(3200.0) == [] and p.flush(3200.0) == []  # its restart sends nothing more


def test_the_ladder_memory_keeps_a_rung_per_job_and_machine(tmp_path):
    from trainctl.store.ladder_memory import LadderMemory

    mem = LadderMemory(tmp_path / "ladder.json")
    assert mem.rung("job", "box", RUNGS) is None
    mem.remember("job", "box", RUNGS, "A2", 1.0)
    assert mem.rung("job", "box", RUNGS) == "A2"
    assert mem.rung("job", "other-box", RUNGS) is None
    assert mem.rung("job", "box", ("A4", "B")) is None  # another ladder starts afresh
    (tmp_path / "ladder.json").write_text("{torn")  # a crashed disk: read as nothing, rewritten
    assert mem.rung("job", "box", RUNGS) is None
    mem.remember("job", "box", RUNGS, "B", 2.0)
    assert mem.rung("job", "box", RUNGS) == "B"


# ---------------------------------------------------------------------- the agent's keeper


def _keeper(tmp_path, preset="A4"):
    from types import SimpleNamespace

    from trainctl.agent.ladder import LadderKeeper
    from trainctl.store.ladder_memory import LadderMemory

    now = [0.0]
    emitted: list = []
    ctx = SimpleNamespace(
        spec=SimpleNamespace(
            ladder=list(RUNGS), preset=preset, job_name="job", host="box", ladder_stable_s=60.0, deadline=None
        ),
        clock=lambda: now[0],
        facts=SimpleNamespace(preset=preset, trainer=None),
        projector=SimpleNamespace(preset=preset),
        emit=emitted.append,
        info=lambda text, key="": emitted.append(("info", text)),
    )
    return LadderKeeper(ctx, LadderMemory(tmp_path / "ladder.json")), emitted, now


def test_the_keeper_steps_down_on_a_hang_and_a_chosen_preset_pins(tmp_path):
    from trainctl.core.recovery import Decision, Outcome

    keeper, emitted, now = _keeper(tmp_path)
    now[0] = 100.0
    d = keeper.after(
        Outcome("stall", True, -9, "A4"),
        Decision("restart", "the trainer stalled; falling back from A4 to B", "B"),
    )
    assert d.preset == "A2" and d.reason == "the trainer stalled; ladder: one rung down to A2"
    assert [e.direction for e in emitted if isinstance(e, E.LadderMove)] == ["down"]
    d = keeper.after(
        Outcome("user_restart", True, -15, "A2", requested_preset="B"),
        Decision("restart", "restart requested by the user", "B"),
    )
    assert d.preset == "B" and keeper.policy.pinned and keeper.policy.preset == "B"
    d = keeper.after(Outcome("stall", True, -9, "B"), Decision("restart", "the trainer stalled", "B"))
    assert d.preset == "B"  # pinned: no move
    assert keeper.unpin() and not keeper.policy.pinned
    # remembered: the next run of the job on this machine starts on B, journaled
    keeper2, emitted2, _ = _keeper(tmp_path)
    assert keeper2.policy.preset == "B" and keeper2.ctx.facts.preset == "B"
    keeper2.before_attempt("B")
    assert [e.direction for e in emitted2 if isinstance(e, E.LadderMove)] == ["start"]


def test_an_agent_that_takes_over_goes_on_from_the_rung_that_ran(tmp_path):
    from trainctl.core.recovery import Decision, Outcome

    keeper, _, _ = _keeper(tmp_path)
    d = keeper.after(Outcome("stall", True, -9, "A2"), Decision("restart", "the trainer stalled", "A2"))
    assert d.preset == "B" and not keeper.policy.pinned


def test_the_restart_of_a_step_up_goes_to_the_rung_above_without_a_pin(tmp_path):
    from trainctl.core.recovery import Decision, Outcome

    keeper, _, _ = _keeper(tmp_path, preset="A2")
    keeper.policy.rung, keeper.planned = 0, "A4"  # as _consider_up leaves it
    d = keeper.after(
        Outcome("user_restart", True, -15, "A2", requested_preset="A4"),
        Decision("restart", "restart requested by the user", "A4"),
    )
    assert d.reason == "ladder: one rung up to A4" and keeper.policy.preset == "A4"
    keeper.before_attempt("A4")
    assert not keeper.policy.pinned
