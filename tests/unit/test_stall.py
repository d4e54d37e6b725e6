"""The stall detector, with a fake clock (time is an argument)."""

from __future__ import annotations

import pytest

from trainctl.core.events import Progress
from trainctl.core.stall import StallDetector, StallVerdict

pytestmark = pytest.mark.timeout(10)


def prog(
    now: float, epoch: int | None, batch: int | None, batches: int | None = 100, rank: int | None = None
) -> Progress:
    return Progress(now, epoch, 10, batch, batches, {"loss": 1.0}, rank=rank)


def run_epoch(
    d: StallDetector, t: float, epoch: int, batches: int, dt: float, total: int | None = None
) -> float:
    """Feed `batches` progress lines of `epoch` (of `total` batches; default: the epoch ends
    with the last one), dt apart, starting at t + dt; returns the last time."""
    if d.phase != "train":
        d.on_phase("train", t)
    for b in range(1, batches + 1):
        t += dt
        d.on_progress(prog(t, epoch, b, total or batches), t)
    return t


def first_verdict(d: StallDetector, start: float, until: float, step: float = 0.25):
    """Check every `step` seconds from `start`; the first (time, verdict) or None."""
    t = start
    while t <= until:
        v = d.check(t)
        if v is not None:
            return t, v
        t = round(t + step, 6)
    return None


def test_learned_threshold_never_below_the_floor():
    d = StallDetector()
    d.reset(0.0)
    t = run_epoch(d, 1.0, 1, 200, 0.05, total=1000)
    assert d.threshold(t) == pytest.approx(30.0)  # 5 × 0.05 s = 0.25 s → the floor
    assert d.check(t + 29.0) is None
    v = d.check(t + 30.5)
    assert v is not None and v.phase == "train" and v.threshold_s == pytest.approx(30.0)


def test_learned_threshold_is_factor_times_slowest_interval_when_above_the_floor():
    d = StallDetector()
    d.reset(0.0)
    t = run_epoch(d, 1.0, 1, 20, 10.0, total=1000)
    assert d.threshold(t) == pytest.approx(50.0)  # 5 × 10 s
    assert d.check(t + 49.0) is None
    assert d.check(t + 51.0) is not None


def test_fixed_train_timeout_overrides_learning_and_the_floor():
    d = StallDetector(train_timeout=5.0)
    d.reset(0.0)
    t = run_epoch(d, 1.0, 1, 100, 2.0)  # learning would say 10 s, floor 30 s
    assert d.threshold(t) == 5.0
    assert d.check(t + 4.9) is None
    assert d.check(t + 5.1) is not None


def test_fixed_timeout_5s_with_fast_batches_fires_at_the_first_check_after_5s():
    d = StallDetector(train_timeout=5.0)
    d.reset(0.0)
    last = run_epoch(d, 2.0, 1, 200, 0.05)  # last progress at 12.0
    when, v = first_verdict(d, 12.25, 30.0)
    assert when == pytest.approx(17.25)  # first 0.25 s check past 17.0
    assert v.idle_s == pytest.approx(when - last) and v.idle_s > 5.0
    assert v.threshold_s == 5.0 and "fixed" in v.reason


def test_one_verdict_per_stall_and_rearm_after_progress():
    d = StallDetector(train_timeout=5.0)
    d.reset(0.0)
    t = run_epoch(d, 0.0, 1, 50, 0.1)
    v1 = d.check(t + 6)
    assert isinstance(v1, StallVerdict)
    assert all(d.check(t + 6 + k) is None for k in range(1, 100))  # no stream
    assert d.idle(t + 50) == pytest.approx(50.0)  # the meter keeps counting
    t2 = t + 200
    d.on_progress(prog(t2, 1, 51), t2)  # it moved: re-armed
    assert d.check(t2 + 4) is None
    v2 = d.check(t2 + 6)
    assert v2 is not None and v2.idle_s == pytest.approx(6.0)


def test_a_repeated_progress_line_is_not_progress():
    d = StallDetector(train_timeout=5.0)
    d.reset(0.0)
    t = run_epoch(d, 0.0, 1, 10, 0.1)
    d.on_progress(prog(t + 4, 1, 10), t + 4)  # the same frame printed again
    assert d.idle(t + 6) == pytest.approx(6.0)
    assert d.check(t + 6) is not None


def test_startup_grace_default_and_no_verdict_before_it():
    d = StallDetector()
    d.reset(100.0)
    assert d.phase == "startup" and d.threshold(100.0) == 600.0
    assert d.check(100 + 599) is None
    v = d.check(100 + 601)
    assert v is not None and v.phase == "startup" and "first batch" in v.reason


def test_startup_grace_extends_on_evidence_and_is_bounded():
    d = StallDetector()
    d.reset(0.0)
    for t in range(0, 3000, 30):  # busy CPU / compile lines forever
        d.on_evidence(float(t), "compile")
        v = d.check(float(t))
        if v is not None:
            break
    assert v is not None
    assert 1800.0 <= v.idle_s <= 1830.0 and v.threshold_s == 1800.0  # the bound
    assert "evidence" in v.reason


def test_startup_evidence_that_stops_gives_the_evidence_window():
    d = StallDetector()
    d.reset(0.0)
    for t in range(0, 901, 60):  # MIOpen lines until 900 s
        d.on_evidence(float(t), "miopen")
    assert d.check(1100.0) is None  # past the 600 s grace
    assert d.threshold(1100.0) == pytest.approx(1200.0)  # 900 + 300
    assert d.check(1201.0) is not None


def test_fixed_startup_timeout_is_not_extended():
    d = StallDetector(startup_timeout=120.0)
    d.reset(0.0)
    d.on_evidence(100.0, "cpu")
    assert d.check(121.0) is not None


def test_startup_ends_at_the_first_batch_and_is_remembered_for_the_next_attempt():
    d = StallDetector()
    d.reset(0.0)
    d.on_phase("train", 10.0)  # runner says train, no batch yet
    assert d.phase == "startup"
    d.on_progress(prog(700.0, 1, 1), 700.0)  # a 700 s compile (evidence kept it alive)
    assert d.phase == "train"
    d.reset(1000.0)  # attempt 2
    assert d.threshold(1000.0) == pytest.approx(1400.0)  # 2 × 700 s seen


def test_slow_but_healthy_validation_and_save_pass():
    d = StallDetector()
    d.reset(0.0)
    t = run_epoch(d, 1.0, 1, 100, 0.5)  # train threshold: floor 30 s
    d.on_phase("val", t)
    assert d.threshold(t) == pytest.approx(300.0)  # first val: max(300, 10 × 30)
    assert first_verdict(d, t, t + 250, step=5) is None  # a 250 s validation is fine
    t += 250
    d.on_phase("save", t)
    assert first_verdict(d, t, t + 280, step=5) is None  # a 280 s save is fine
    t += 280
    d.on_phase("train", t)
    assert d.phase == "save"  # until the first batch comes
    t += 20  # slow first batch (workers restart)
    t = run_epoch(d, t - 0.5, 2, 100, 0.5)
    d.on_phase("val", t)
    assert d.threshold(t) == pytest.approx(750.0)  # 3 × 250 s learned
    assert first_verdict(d, t, t + 700, step=10) is None
    d.on_phase("save", t + 700)
    assert d.threshold(t + 700) == pytest.approx(3 * 300.0)  # 280 s save + 20 s first batch
    assert d.check(t + 700 + 901) is not None


def test_a_mid_epoch_save_ends_at_its_train_phase_but_an_epoch_end_save_waits_for_a_batch():
    """A hang right after a mid-epoch checkpoint is watched with the train threshold from
    the save's end (bench_incidents: a spin after a periodic save waited 3 x the longest save)."""
    d = StallDetector(train_timeout=10.0)
    d.reset(0.0)
    t = run_epoch(d, 0.0, 1, 12, 1.0, total=20)  # batch 12 of 20
    d.on_phase("save", t)
    d.on_phase("train", t + 5)  # a 5 s mid-epoch save
    assert d.phase == "train"
    assert d.check(t + 5 + 9.5) is None
    verdict = d.check(t + 5 + 10.5)
    assert verdict is not None and verdict.phase == "train"
    # The save at the epoch's end (batch 20 of 20) still lasts until the next batch.
    e = StallDetector(train_timeout=10.0)
    e.reset(0.0)
    t = run_epoch(e, 0.0, 1, 20, 1.0)
    e.on_phase("save", t)
    e.on_phase("train", t + 5)
    assert e.phase == "save" and e.check(t + 5 + 10.5) is None


def test_first_batch_after_validation_counts_toward_validation_not_train():
    d = StallDetector()
    d.reset(0.0)
    t = run_epoch(d, 0.0, 1, 50, 0.1)
    d.on_phase("val", t)
    d.on_phase("train", t + 30)
    assert d.phase == "val" and d.check(t + 200) is None  # 200 s with no batch: val's budget
    d.on_progress(prog(t + 200, 2, 1, 50), t + 200)
    assert d.phase == "train"
    assert d.state_dict()["val"] == [pytest.approx(200.0)]
    assert max(d.state_dict()["train"]) < 1.0  # train intervals not polluted


def test_warmup_intervals_do_not_teach_the_train_threshold():
    d = StallDetector(floor=1.0)
    d.reset(0.0)
    d.on_phase("train", 0.0)
    t = 0.0
    for epoch in (1, 2):
        for b in range(1, 21):
            t += 10.0 if b <= 3 else 0.1  # slow first batches of each epoch
            d.on_progress(prog(t, epoch, b, 20), t)
    state = d.state_dict()
    assert max(state["train"]) == pytest.approx(0.1)
    assert d.threshold(t) == pytest.approx(3 * 10.0)  # epoch's end: 3 × the 10 s gap seen
    t += 1.0
    d.on_progress(prog(t, 3, 1, 20), t)  # epoch 3 begins
    assert d.threshold(t) == pytest.approx(50.0)  # warm-up: 5 × 10 s
    for b in range(2, 6):
        t += 0.1
        d.on_progress(prog(t, 3, b, 20), t)
    assert d.threshold(t) == pytest.approx(1.0)  # steady: 5 × 0.1 s → floor 1 s


def test_silent_gap_between_epochs_gets_a_first_phase_budget_then_is_learned():
    d = StallDetector()
    d.reset(0.0)
    t = run_epoch(d, 0.0, 1, 50, 0.1)  # last line: batch 50/50
    assert d.threshold(t) == pytest.approx(300.0)  # a silent val may follow
    t += 120  # a 120 s silent validation
    d.on_progress(prog(t, 2, 1, 50), t)
    for b in range(2, 51):
        t += 0.1
        d.on_progress(prog(t, 2, b, 50), t)
    assert d.threshold(t) == pytest.approx(360.0)  # 3 × 120 s
    assert d.check(t + 359) is None and d.check(t + 361) is not None


def test_reset_keeps_learning_and_state_dict_round_trips():
    d = StallDetector()
    d.reset(0.0)
    t = run_epoch(d, 0.0, 1, 40, 8.0, total=1000)
    learned = d.threshold(t)
    assert learned == pytest.approx(40.0)
    d.reset(t + 10)
    assert d.phase == "startup"
    d.on_progress(prog(t + 20, 2, 1, 1000), t + 20)
    for b in range(2, 6):
        d.on_progress(prog(t + 20 + 8 * b, 2, b, 1000), t + 20 + 8 * b)
    assert d.threshold(t + 60) == pytest.approx(40.0)
    fresh = StallDetector()
    fresh.load_state_dict(d.state_dict())
    assert fresh.state_dict() == d.state_dict()
    fresh.load_state_dict({"version": 99, "train": [1e9]})  # unknown version: ignored
    fresh.load_state_dict({"version": 1, "train": ["x", -1, 2.0], "val": None})
    assert fresh.state_dict()["train"] == [2.0]


def test_one_stuck_rank_among_moving_ones_is_named():
    d = StallDetector(train_timeout=5.0)
    d.reset(0.0)
    d.on_phase("train", 0.0)
    t = 0.0
    for b in range(1, 40):
        t += 0.1
        d.on_progress(prog(t, 1, b, 1000, rank=0), t)
        if b <= 20:
            d.on_progress(prog(t, 1, b, 1000, rank=1), t)  # rank 1 stops after batch 20
    v = None
    while v is None and t < 20:
        t += 0.1
        d.on_progress(prog(t, 1, int(t * 10), 1000, rank=0), t)
        v = d.check(t)
    assert v is not None and v.ranks == (1,) and "rank 1" in v.reason
    t_stop = t
    assert d.check(t + 0.1) is None  # once
    w = first_verdict(d, t_stop + 0.25, t_stop + 10)  # now rank 0 stops too
    assert w is not None and w[1].ranks == (0, 1)


def test_finished_never_stalls_and_bad_settings_are_refused():
    d = StallDetector(train_timeout=5.0)
    d.reset(0.0)
    run_epoch(d, 0.0, 1, 10, 0.1)
    d.on_phase("finished", 2.0)
    assert d.check(10_000.0) is None and d.threshold(10_000.0) is None
    with pytest.raises(ValueError, match="train_timeout"):
        StallDetector(train_timeout=0)
    with pytest.raises(ValueError, match="floor"):
        StallDetector(floor=-1)
    with pytest.raises(ValueError, match="phase"):
        d.on_phase("eval", 1.0)


# ---------------------------------------------------------------- issue 16: unknown formats, still trees


def feed_lines(d: StallDetector, t: float, n: int, gap: float) -> float:
    """`n` console lines `gap` apart from t + gap; the last time."""
    for _ in range(n):
        t += gap
        d.on_output(t)
    return t


def test_unknown_format_watches_output_silence_with_the_floor():
    d = StallDetector()
    d.reset(0.0)
    t = feed_lines(d, 0.0, 19, 1.0)
    assert not d.watching_silence and d.threshold(t) == 600.0  # 19 lines in 18 s: not yet
    t = feed_lines(d, t, 1, 1.0)
    assert d.watching_silence  # 20 lines, no progress
    assert d.threshold(t) == pytest.approx(60.0)  # 2 × 1 s < the 60 s floor
    assert d.check(t + 59.0) is None
    v = d.check(t + 60.5)
    assert v is not None and v.phase == "startup" and "no output" in v.reason
    assert "unknown progress format" in v.reason


def test_unknown_format_is_decided_by_time_too_and_a_steady_printer_is_watched():
    """Issue 26: a line every 10 s is unknown after 30 s; a steady printer (a line every
    0.2 s, never a 'burst') after 20 lines, and its hang is caught at the floor."""
    slow = StallDetector()
    slow.reset(0.0)
    t = feed_lines(slow, 0.0, 3, 10.0)
    assert not slow.watching_silence
    t = feed_lines(slow, t, 1, 10.0)  # 30 s since the first line
    assert slow.watching_silence and slow.threshold(t) == pytest.approx(60.0)
    steady = StallDetector()
    steady.reset(0.0)
    t = feed_lines(steady, 0.0, 60, 0.2)
    assert steady.watching_silence
    when, v = first_verdict(steady, t, t + 120)
    assert 60.0 <= when - t <= 60.25 and v.threshold_s == 60.0


def test_unknown_format_threshold_is_twice_the_high_quantile_of_the_intervals():
    d = StallDetector(silence_floor=5.0)
    d.reset(0.0)
    t = feed_lines(d, 0.0, 6, 1.0)
    t = feed_lines(d, t, 1, 40.0)  # a 40 s healthy silence
    t = feed_lines(d, t, 3, 1.0)
    assert d.threshold(t) == pytest.approx(80.0)
    assert d.check(t + 79) is None and d.check(t + 81) is not None
    d2 = StallDetector(silence_floor=5.0)
    d2.reset(0.0)
    t = feed_lines(d2, 0.0, 20, 1.0)  # ~1 s silences: the floor
    when, v = first_verdict(d2, t, t + 20)
    assert when - t == pytest.approx(5.25) and v.threshold_s == 5.0
    fast = StallDetector(silence_floor=5.0)  # 0.1 s apart, one 3 s pause
    fast.reset(0.0)
    t = feed_lines(fast, 0.0, 300, 0.1)
    t = feed_lines(fast, t, 1, 3.0)
    t = feed_lines(fast, t, 300, 0.1)
    assert fast.threshold(t) == pytest.approx(5.0)  # 2 × 0.1 s; 1.5 × 3 s = 4.5 s < floor
    fast2 = StallDetector(silence_floor=1.0)
    fast2.reset(0.0)
    t = feed_lines(fast2, 0.0, 300, 0.1)
    t = feed_lines(fast2, t, 1, 3.0)
    t = feed_lines(fast2, t, 300, 0.1)
    assert fast2.threshold(t) == pytest.approx(4.5)  # the rare pause: 1.5 × its 3 s


def test_unknown_format_silence_per_rank_waits_for_every_watched_rank():
    d = StallDetector()
    d.reset(0.0)
    for k in range(1, 41):  # ranks 0 and 1, a line a second each
        d.on_output(float(k), 1, 0)
        d.on_output(float(k), 1, 1)
    assert d.watching_silence
    for k in range(41, 121):  # rank 0 goes on alone (rank 1 waits)
        d.on_output(float(k), 1, 0)
        assert d.check(float(k)) is None
    v = d.check(181.0)  # both silent past 60 s
    assert v is not None and v.ranks == (0, 1) and "rank 0" in v.reason, v


def test_progress_ends_the_silence_watch_and_a_burst_of_lines_is_not_a_rhythm():
    d = StallDetector()
    d.reset(0.0)
    for k in range(200):  # a config dump: one burst
        d.on_output(1.0 + k * 0.001)
    assert not d.watching_silence and d.threshold(2.0) == 600.0
    t = feed_lines(d, 2.0, 6, 1.0)
    assert d.watching_silence
    d.on_progress(prog(t + 1, 1, 1), t + 1)
    assert not d.watching_silence and d.phase == "train"
    assert d.state_dict()["silence"]  # learned, kept across restarts


def test_still_tree_before_the_first_batch_is_a_deadlock_after_the_default_90s():
    d = StallDetector()
    d.reset(0.0)
    d.on_output(1.0)
    for t in range(2, 200):
        d.on_tree(float(t), 0.5, 1000)  # idle CPU, bytes unchanged
        v = d.check(float(t))
        if v is not None:
            break
    assert v is not None and t == 93 and v.threshold_s == 90.0  # > 90 s after the first sample (2 s)
    assert "deadlock before the first batch" in v.reason
    assert d.check(float(t + 1)) is None  # once


def test_busy_cpu_or_io_keeps_the_long_startup_grace():
    d = StallDetector()
    d.reset(0.0)
    for t in range(1, 300):  # a silent compile: CPU busy
        d.on_tree(float(t), 180.0, 1000)
        assert d.check(float(t)) is None
    io = 1000
    for t in range(300, 590):  # a download: low CPU, bytes move
        io += 4096 if t % 3 == 0 else 0
        d.on_tree(float(t), 1.0, io)
        assert d.check(float(t)) is None
    v = d.check(601.0)  # still the startup grace
    assert v is not None and "first batch" in v.reason and v.threshold_s == 600.0


def test_startup_idle_is_a_setting_and_can_be_off_and_never_fires_without_samples():
    d = StallDetector(startup_idle=10.0)
    d.reset(0.0)
    d.on_tree(1.0, None, None)  # first sample: not known yet
    d.on_tree(2.0, 0.0, 50)
    assert d.check(11.0) is None
    v = d.check(11.5)
    assert v is not None and v.threshold_s == 10.0
    off = StallDetector(startup_idle=None)
    off.reset(0.0)
    off.on_tree(1.0, 0.0, 5)
    assert off.check(500.0) is None
    unsampled = StallDetector()
    unsampled.reset(0.0)
    assert unsampled.check(500.0) is None  # nothing known about the tree
    after = StallDetector(startup_idle=10.0)
    after.reset(0.0)
    after.on_tree(1.0, 0.0, 5)
    after.on_progress(prog(2.0, 1, 1), 2.0)  # the first batch: not startup
    after.on_tree(3.0, 0.0, 5)
    assert after.check(40.0) is None


def test_a_multi_node_torchrun_is_known_to_wait_for_other_nodes():
    from trainctl.core.torchrun import rendezvous_wait

    assert rendezvous_wait(["torchrun", "--nnodes", "2", "--nproc-per-node", "8", "train.py"])
    assert rendezvous_wait(["python", "-m", "torch.distributed.run", "--nnodes=1:4", "train.py"])
    assert rendezvous_wait(["/opt/venv/bin/torchrun", "--nnodes=1", "train.py"]) is None
    assert rendezvous_wait(["torchrun", "--nproc-per-node", "2", "train.py"]) is None
    assert rendezvous_wait(["python", "train.py", "--nnodes", "2"]) is None


# ---------------------------------------------------------------- issue 26: still trees at every boundary


def still_until(
    d: StallDetector, t: float, until: float, cpu: float = 0.5, io: int = 1000, step: float = 1.0
):
    """Sample a still tree (or a busy one: cpu, io moving) every `step` s and check; the
    first (time, verdict) or None."""
    n = 0
    while t <= until:
        n += 1
        d.on_tree(t, cpu, io + (n * 4096 if io < 0 else 0))
        v = d.check(t)
        if v is not None:
            return t, v
        t += step
    return None


def trained(**kw) -> tuple[StallDetector, float]:
    """An epoch of 20 batches 0.1 s apart (the train threshold: the 30 s floor)."""
    d = StallDetector(**kw)
    d.reset(0.0)
    return d, run_epoch(d, 0.0, 1, 20, 0.1)


@pytest.mark.parametrize("phase", ["val", "save"])
def test_a_still_first_validation_or_save_is_a_deadlock_after_45s_a_busy_one_runs_on(phase):
    d, t = trained()
    d.on_phase(phase, t)
    assert d.threshold(t) == 300.0  # nothing learned: the default
    when, v = still_until(d, t, t + 400)
    assert when - t == pytest.approx(46.0) and v.still and v.phase == phase and v.threshold_s == 45.0
    assert "deadlock in" in v.reason and "no output, no CPU and no I/O" in v.reason
    busy, t = trained()
    busy.on_phase(phase, t)
    when, v = still_until(busy, t, t + 400, cpu=95.0)  # a busy one: its own threshold
    assert when - t == pytest.approx(301.0) and not v.still and v.threshold_s == 300.0
    io, t = trained()
    io.on_phase(phase, t)
    assert still_until(io, t, t + 290, io=-1) is None  # I/O moving, CPU idle: busy


def test_awaiting_the_first_batch_after_a_validation_is_watched_too():
    """Ultralytics: the validation ends ('train' said), then its workers restart: the phase
    lasts until the first batch; a still tree there is a deadlock at the first batch."""
    d, t = trained()
    d.on_phase("val", t)
    t += 20.0
    d.on_tree(t, 90.0, 1000)  # a busy validation of 20 s
    d.on_phase("train", t)
    when, v = still_until(d, t + 1, t + 200)
    assert v.still and v.phase == "val" and "awaiting the first batch after it" in v.reason
    assert when - t == pytest.approx(46.0)


def test_a_silent_gap_after_an_epochs_last_batch_is_watched_when_still():
    """A plain loop: its validation prints nothing after the epoch's last batch."""
    d, t = trained()
    when, v = still_until(d, t, t + 400)
    assert v.still and v.phase == "train" and "after the last batch of the epoch" in v.reason
    assert when - t == pytest.approx(46.0)
    mid = StallDetector()
    mid.reset(0.0)
    t = run_epoch(mid, 0.0, 1, 20, 0.1, total=100)  # mid-epoch: the batch thresholds
    when, v = still_until(mid, t, t + 400)
    assert not v.still and v.threshold_s == 30.0


def test_the_stall_timeout_and_learned_thresholds_bound_a_still_phase():
    d, t = trained(train_timeout=8.0)
    d.on_phase("save", t)
    when, v = still_until(d, t, t + 100)
    assert v.still and v.threshold_s == 8.0 and when - t == pytest.approx(9.0)
    assert "fixed train timeout" in v.reason
    learned, t = trained()
    learned.on_phase("val", t)
    t += 4.0
    learned.on_phase("train", t)  # a 4 s validation, learned
    t = run_epoch(learned, t, 2, 20, 0.1)
    learned.on_phase("val", t)
    assert learned.threshold(t) == 30.0  # max(floor, 3 × 4 s)
    when, v = still_until(learned, t, t + 100)
    assert not v.still and when - t == pytest.approx(31.0)  # the learned one came first
    busy_startup = StallDetector(train_timeout=8.0)
    busy_startup.reset(0.0)
    assert busy_startup.still_window("startup")[0] == 90.0  # start-up keeps its window


def test_a_trainer_speaking_on_the_side_channel_is_no_unknown_format():
    d = StallDetector()
    d.reset(0.0)
    d.on_structured()  # a runner said something
    feed_lines(d, 0.0, 60, 0.5)
    assert not d.watching_silence and d.threshold(30.0) == 600.0
    d.reset(40.0)  # a new attempt: guessed again
    feed_lines(d, 40.0, 60, 0.5)
    assert d.watching_silence


def test_output_silence_alone_is_no_hang_while_the_tree_works():
    """An unknown format (20 lines), then a silent, CPU-busy compile: the start-up's limit,
    not the silence floor; once the tree is still as long as the silence limit: a stall."""
    from trainctl.core.stall import StallDetector

    d = StallDetector()
    t = 1000.0
    d.reset(t)
    for _ in range(25):
        t += 0.2
        d.on_output(t)
    assert d.watching_silence
    last_line = t
    for k in range(1, 200):  # 200 s of busy CPU, no output
        d.on_tree(last_line + k, 150.0, 1000)
        assert d.check(last_line + k) is None, k
    still_from = last_line + 199
    for k in range(1, 70):
        d.on_tree(still_from + k, 0.0, 1000)
    assert d.check(still_from + 59) is None  # still for 59 s: not yet
    assert d.check(still_from + 61) is not None


def test_mode_says_what_the_silence_is_judged_as():
    d = StallDetector()
    assert d.mode() == "startup"
    t = run_epoch(d, 0.0, 1, 10, 0.1, total=20)
    assert d.mode() == "train"
    t = run_epoch(d, t, 1, 20, 0.1)
    assert d.mode() == "boundary"  # after the epoch's last batch
    d.on_phase("val", t + 0.1)
    assert d.mode() == "val"
    d.on_phase("finished", t + 0.2)
    assert d.mode() == "finished"
