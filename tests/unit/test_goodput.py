"""The goodput accumulator (core/goodput.py) on replayed event sequences."""

from __future__ import annotations

import pytest

from trainctl.core import events as E
from trainctl.core.goodput import BUCKETS, Goodput, describe
from trainctl.core.runview import RunView


def fold(events: list[E.Event]) -> Goodput:
    g = Goodput()
    for e in events:
        g.apply(e)
    return g


def sums_to_wall(t: dict) -> None:
    total = t["productive_s"] + sum(t["buckets"].values())
    assert total == pytest.approx(t["wall_s"], rel=0.01)
    assert set(t["buckets"]) | {"productive"} == set(BUCKETS)


def progress(ts: float, epoch: int, batch: int, batches: int = 10) -> E.Progress:
    return E.Progress(ts, epoch, 3, batch, batches, {"loss": 1.0})


def attempt(t0: float, n: int, first_batch: int, last_batch: int, epoch: int = 1) -> list[E.Event]:
    """Attempt ``n``: 10 s of start-up, then a batch a second from ``first_batch``."""
    out: list[E.Event] = [E.Start(t0, n, 100 + n, "A"), E.Phase(t0, "startup"), E.Phase(t0 + 10, "train")]
    out += [progress(t0 + 10 + i + 1, epoch, b) for i, b in enumerate(range(first_batch, last_batch + 1))]
    return out


def test_a_clean_run_is_start_up_training_validation_and_checkpoints():
    evs = attempt(0, 1, 1, 10)  # batches 1..10 at 11..20
    evs += [E.Phase(20, "val"), E.Phase(25, "save"), E.Checkpoint(27, "ck.pt", 1), E.Phase(28, "finished")]
    evs += [E.Exit(30, 0), E.State(30, "FINISHED"), E.Info(99, "a late note")]
    t = fold(evs).totals(now=500)  # a finished run's wall time does not go on
    sums_to_wall(t)
    assert t["wall_s"] == 30
    assert t["productive_s"] == 10
    b = t["buckets"]
    assert (b["startup"], b["validation"], b["checkpoint"], b["ending"]) == (10, 5, 3, 2)
    assert t["ratio"] == pytest.approx(10 / 30, abs=1e-3)


@pytest.mark.parametrize("stall_first", [True, False], ids=["state-then-stall", "stall-then-state"])
def test_a_stall_and_a_restart_split_into_detection_diagnosis_restart_and_redone(stall_first):
    evs = attempt(0, 1, 1, 6)  # batch 6 at 16; a checkpoint at batch 3 was the last good
    hang = [E.State(26, "STALLED", "no batch"), E.Stall(28, "train", 10.0, "deadlock")]
    evs += hang if stall_first else hang[::-1]
    evs += [E.Info(29, "diagnosis: deadlock")]  # a verdict as a later event: no change
    evs += [E.State(30, "STOPPING", "stall"), E.Exit(32, -15, "SIGTERM"), E.State(32, "BACKOFF")]
    evs += [E.Restart(32, 2, "stalled", "B", "ck.pt", 1.0), E.State(33, "STARTING")]
    evs += attempt(33, 2, 4, 10)  # resumes at batch 4: 4, 5, 6 redone (44..46), 7..10 new
    evs += [E.Exit(51, 0), E.State(51, "FINISHED")]
    g = fold(evs)
    t = g.totals()
    sums_to_wall(t)
    b = t["buckets"]
    assert t["wall_s"] == 51
    assert b["startup"] == 10
    assert b["detection"] == (10 if stall_first else 12)  # from batch 6 (16) to the first sign
    assert b["diagnosis"] == (6 if stall_first else 4)  # to the exit
    assert b["restart"] == 0 + 1 + 10  # backoff 32..33, start-up 33..43
    assert b["redone"] == 3  # batches 4, 5, 6 again
    assert t["productive_s"] == 6 + 4 + 1  # and the last batch to the exit
    assert b["ending"] == 0


def test_a_journaled_interval_that_crosses_the_furthest_batch_moves_its_redone_share():
    """The journal keeps about one progress a second: a fast attempt 2 journals batch 2,
    then batch 9, past the furthest (6).  Of that interval, batches 3..6 of 3..9 were redone."""
    evs = attempt(0, 1, 1, 6)  # batch 6 at 16
    evs += [E.Stall(26, "train", 10.0, "deadlock"), E.Exit(30, -9, "SIGKILL")]
    evs += [E.Restart(30, 2, "stalled", "B", "ck.pt", 0.0)]
    evs += [E.Start(30, 2, 102, "B"), E.Phase(30, "startup"), E.Phase(40, "train")]
    evs += [
        progress(41, 1, 2),
        progress(48, 1, 9),
        progress(49, 1, 10),
        E.Exit(50, 0),
        E.State(50, "FINISHED"),
    ]
    t = fold(evs).totals()
    sums_to_wall(t)
    b = t["buckets"]
    assert b["redone"] == pytest.approx(1 + 7 * 4 / 7)  # batch 2 (40..41), then 4 s of 41..48
    assert t["productive_s"] == pytest.approx(6 + 3 + 1 + 1)  # 10..16, 45..48 (batches 7..9), 48..49, 49..50


def test_a_stall_event_after_the_batches_came_back_is_no_new_hang():
    evs = attempt(0, 1, 1, 4)  # batch 4 at 14
    evs += [E.State(20, "STALLED", "no batch for 6 s"), progress(21, 1, 5), E.State(21, "RUNNING")]
    evs += [E.Stall(22, "train", 6.0, "spin"), progress(23, 1, 6)]  # its diagnosis, late
    t = fold(evs).totals()
    sums_to_wall(t)
    assert t["buckets"]["detection"] == 6 and t["buckets"]["diagnosis"] == 1
    assert t["productive_s"] == 4 + 2


def test_a_slurm_job_chain_counts_the_queue_wait_between_jobs():
    evs = attempt(0, 1, 1, 5)
    evs += [E.Phase(15, "save"), E.Checkpoint(17, "ck.pt", 1, batch=5, kind="planned")]
    evs += [E.Exit(18, 0), E.State(18, "PENDING", "Slurm job 8 is queued")]
    evs += [E.State(318, "STARTING", "job 8"), *attempt(318, 2, 6, 10)]  # 300 s in the queue
    evs += [E.Exit(334, 0), E.State(334, "FINISHED")]
    t = fold(evs).totals()
    sums_to_wall(t)
    assert t["buckets"]["queue"] == 300
    assert t["buckets"]["restart"] == 10
    assert t["buckets"]["redone"] == 0
    assert t["productive_s"] == 11  # 10 batches, and the last one's end to the exit


def test_with_auto_recovery_off_the_wait_for_the_key_is_no_diagnosis():
    """The verdict came 4 s after the stall; the user pressed restart 10 minutes later: those
    minutes await a decision, and only the stacks and the kill are the diagnosis."""
    evs = attempt(0, 1, 1, 6)  # batch 6 at 16
    evs += [E.State(26, "STALLED", "no batch"), E.Stall(26, "train", 10.0, E.DIAGNOSING)]
    evs += [E.StallDiagnosis(30, "train", "deadlock", 0.0, None, "main waits")]
    evs += [E.State(630, "STOPPING", "restart by the user"), E.Exit(632, -15, "SIGTERM")]
    evs += [E.State(632, "BACKOFF"), E.Restart(632, 2, "by the user", "A", None), E.State(633, "STARTING")]
    evs += attempt(633, 2, 1, 2)
    t = fold(evs).totals()
    sums_to_wall(t)
    b = t["buckets"]
    assert (b["detection"], b["diagnosis"], b["awaiting"]) == (10, 4 + 2, 600)
    assert "lost 11 min: awaiting a decision 10," in describe(t)  # minutes, the biggest first


def test_a_pause_by_the_user_and_a_stopped_run_that_goes_on():
    evs = attempt(0, 1, 1, 3)
    evs += [E.State(14, "PAUSED", "by the user"), E.State(74, "RUNNING"), progress(75, 1, 4)]
    evs += [E.State(76, "STOPPING"), E.Exit(77, -15, "SIGTERM"), E.State(77, "STOPPED")]
    evs += [E.Info(80, "note")]  # after the end: not wall time
    evs += [E.State(177, "STARTING"), *attempt(177, 2, 5, 6), E.Exit(190, 0), E.State(190, "FINISHED")]
    t = fold(evs).totals()
    sums_to_wall(t)
    assert t["buckets"]["paused"] == 60 + 100  # the pause, and the stopped gap
    assert t["wall_s"] == 190


def test_a_live_run_goes_on_to_now_in_its_mode_and_restores_from_its_dict():
    evs = attempt(0, 1, 1, 4)
    g = fold(evs)
    t = g.totals(now=20)
    sums_to_wall(t)
    assert t["wall_s"] == 20 and t["productive_s"] == 10
    g2 = Goodput()
    g2.load_dict(g.to_dict())
    for e in [progress(21, 1, 5), E.State(40, "STALLED")]:
        g.apply(e)
        g2.apply(e)
    assert g.to_dict() == g2.to_dict()
    assert g.totals()["buckets"]["detection"] == 19


def test_ranks_other_than_the_lowest_do_not_count_as_redone():
    evs: list[E.Event] = [E.Start(0, 1, 1, "A"), E.Phase(0, "train")]
    for i in range(1, 6):
        evs += [E.Progress(i, 1, 1, i, 10, rank=0), E.Progress(i + 0.5, 1, 1, i, 10, rank=1)]
    t = fold(evs).totals()
    assert t["buckets"]["redone"] == 0
    assert t["productive_s"] == 5.5


def test_the_run_view_keeps_it_in_its_snapshot_and_an_older_snapshot_is_refolded():
    evs = [E.with_seq(e, i) for i, e in enumerate(attempt(0, 1, 1, 4))]
    view = RunView()
    view.apply_all(evs[:3])
    d = view.to_dict()
    restored = RunView()
    restored.load_dict(d)
    view.apply_all(evs[3:])
    restored.apply_all(evs[3:])
    assert restored.goodput.totals() == view.goodput.totals()
    assert view.goodput.totals()["productive_s"] == 4
    del d["goodput"]
    with pytest.raises(ValueError):
        RunView().load_dict(d)


def test_describe_is_one_line_with_the_biggest_losses_first():
    t = {
        "wall_s": 3600.0,
        "productive_s": 3000.0,
        "ratio": 3000 / 3600,
        "buckets": {"restart": 360.0, "detection": 180.0, "validation": 60.0, "queue": 0.0},
    }
    assert describe(t) == "goodput 83.3 % · lost 10 min: restart start-up 6, detection 3, validation 1"
    assert describe({"ratio": None}) == "goodput -"
