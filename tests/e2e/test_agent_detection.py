"""Issue 3, end to end: the agent notices real hangs, diagnoses them and (with auto-recovery
off) leaves the run for the user.

Real hangs: a DataLoader worker blocked forever on an Event, a spinning process after the
MIOpen warning, a trainer stopped with SIGSTOP, a worker killed with SIGKILL; and a real
Ultralytics run whose validation outlasts the train threshold without a false stall.
Every run is killed as a whole tree afterwards (conftest).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import (
    PYTHON,
    ROOT,
    run_trainctl,
    start_trainctl,
    write_command_job,
    write_ultralytics_job,
)
from tests.helpers.hangs import MIOPEN_SPIN, STEADY, TRAIN_LOOP

pytestmark = pytest.mark.e2e


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _main_thread_stack(stacks_file: str, pid: int) -> str:
    """The py-spy frames of the main thread of ``pid`` in a trainctl stall dump."""
    text = Path(stacks_file).read_text(encoding="utf-8")
    section = re.search(rf"^=== pid {pid} .*?(?=^=== pid |\Z)", text, re.M | re.S)
    assert section, f"no section for pid {pid} in {stacks_file}:\n{text[:3000]}"
    main = re.search(
        r'^Thread \S+ \(\w+\): "MainThread"\n(.*?)(?=^Thread |\Z)', section.group(0), re.M | re.S
    )
    assert main, f"no MainThread stack for pid {pid}:\n{section.group(0)[:3000]}"
    return main.group(1)


def _last_progress_before(events, ev):
    before = [e for e in events if e.type == "progress" and e.seq < ev.seq]
    assert before, "no progress before the stall"
    return before[-1]


@pytest.mark.timeout(120)
def test_worker_deadlock_in_epoch_2_is_a_deadlock_and_waits_for_the_user():
    """Non-persistent workers: those of epoch 1 are gone in epoch 2 — still a deadlock,
    not a dead worker.  Auto-recovery off: STALLED, nothing killed, `ctl stop` ends it."""
    timeout = 5.0
    with start_trainctl(
        [
            "run",
            "--json",
            "--stall-timeout",
            str(timeout),
            "--no-auto-recover",
            "--",
            PYTHON,
            str(TRAIN_LOOP),
            "--epochs",
            "3",
            "--batches",
            "20",
            "--batch-time",
            "0.05",
            "--hang-at",
            "2:5",
            "--hang-kind",
            "worker",
        ]
    ) as tc:
        start = tc.wait_event("start", 30)
        stall = tc.wait_event("stall", 90)
        events = tc.events()
        last = _last_progress_before(events, stall)
        assert (last.epoch, last.batch) == (2, 4), last
        verdict = tc.wait_event("stall_diagnosis", 60)  # the stall at detection, its verdict after
        assert stall.phase == "train" and verdict.diagnosis == "deadlock", (stall, verdict)
        assert verdict.cpu_percent is not None and verdict.cpu_percent < 10, stall
        # Latency: the stall event comes at most 5 s after the threshold was crossed
        # (the detector polls every 0.25 s; the rest is the diagnosis with py-spy).
        late = stall.ts - last.ts - timeout
        assert 0 < late < 5, f"stall event {late:.2f}s after the threshold"
        assert stall.idle_s >= timeout and stall.threshold_s == timeout
        stack = _main_thread_stack(verdict.stacks, start.pid)
        assert "_get_data" in stack or "_try_get_data" in stack, stack
        assert "DataLoader" in verdict.detail, verdict.detail
        # STALLED, and the run is left alone: no kill, the trainer still there.
        states = [e.state for e in events if e.type == "state"]
        assert states[-1] == "STALLED", states
        time.sleep(1.5)
        assert _alive(start.pid)
        assert not [e for e in tc.events() if e.type in ("exit", "restart")]
        pids = tc.tree_pids()
        ctl = run_trainctl(["ctl", str(tc.run_dir), "stop"], timeout=30)
        assert ctl.returncode == 0, ctl.describe()
        r = tc.wait(30)
    assert r.returncode == 130, r.describe()
    assert [e.type for e in r.events[-2:]] == ["exit", "state"] and r.events[-1].state == "STOPPED"
    assert [p for p in pids if _alive(p)] == []


@pytest.mark.timeout(60)
def test_miopen_warning_then_spin_before_the_first_batch(tmp_path):
    job = write_command_job(tmp_path / "job", [PYTHON, str(MIOPEN_SPIN)], stall={"startup_timeout": 3})
    with start_trainctl(["run", str(job), "--json", "--no-auto-recover"]) as tc:
        stall = tc.wait_event("stall", 45)
        events = tc.events()
        warnings = [e for e in events if e.type == "warning"]
        assert any("miopen" in w.id for w in warnings), warnings
        verdict = tc.wait_event("stall_diagnosis", 60)
        assert stall.phase == "startup" and verdict.diagnosis == "spin", (stall, verdict)
        assert not [e for e in events if e.type == "progress"]
        tc.signal(signal.SIGINT)
        r = tc.wait(30)
    assert r.returncode == 130, r.describe()


@pytest.mark.timeout(60)
def test_a_trainer_stopped_with_sigstop_is_stopped():
    with start_trainctl(
        [
            "run",
            "--json",
            "--stall-timeout",
            "2",
            "--no-auto-recover",
            "--",
            PYTHON,
            str(STEADY),
            "--epochs",
            "1",
            "--batches",
            "2000",
            "--batch-time",
            "0.02",
        ]
    ) as tc:
        start = tc.wait_event("start", 30)
        tc.wait_event(lambda e: e.type == "progress" and (e.batch or 0) >= 10, 30, "progress")
        os.kill(start.pid, signal.SIGSTOP)
        stall = tc.wait_event("stall", 30)
        verdict = tc.wait_event("stall_diagnosis", 60)
        assert verdict.diagnosis == "stopped", (stall, verdict)
        assert f"kill -CONT {start.pid}" in verdict.detail, verdict.detail
        tc.signal(signal.SIGINT)  # the agent must still kill a stopped tree (SIGCONT)
        r = tc.wait(30)
    assert r.returncode == 130, r.describe()
    assert not _alive(start.pid)


@pytest.mark.timeout(90)
def test_a_dataloader_worker_killed_with_sigkill_is_recognised():
    """torch notices the dead worker itself: its error is a warning; no restart budget → FAILED."""
    with start_trainctl(
        [
            "run",
            "--json",
            "--max-restarts",
            "0",
            "--",
            PYTHON,
            str(TRAIN_LOOP),
            "--epochs",
            "1",
            "--batches",
            "400",
            "--batch-time",
            "0.05",
        ]
    ) as tc:
        start = tc.wait_event("start", 30)
        tc.wait_event(lambda e: e.type == "progress" and (e.batch or 0) >= 3, 60, "progress")
        workers = psutil.Process(start.pid).children()
        assert len(workers) == 2, workers
        workers[0].send_signal(signal.SIGKILL)
        r = tc.wait(60)
    assert r.returncode == 1, r.describe()
    warnings = {w.id for w in r.of_type("warning")}
    assert warnings & {"dl.worker_killed_signal", "dl.worker_exited"}, warnings
    assert [e.state for e in r.of_type("state")][-1] == "FAILED"


@pytest.mark.timeout(60)
def test_a_multiprocessing_worker_killed_with_sigkill_is_a_dead_worker():
    """A plain multiprocessing producer dies: the main process waits forever on the queue."""
    with start_trainctl(
        [
            "run",
            "--json",
            "--stall-timeout",
            "2",
            "--no-auto-recover",
            "--",
            PYTHON,
            str(STEADY),
            "--epochs",
            "1",
            "--batches",
            "2000",
            "--batch-time",
            "0.02",
            "--mp-workers",
            "1",
        ]
    ) as tc:
        start = tc.wait_event("start", 30)
        tc.wait_event(lambda e: e.type == "progress" and (e.batch or 0) >= 10, 30, "progress")
        time.sleep(1.2)  # the agent's 1 s tick has seen the worker
        (worker,) = psutil.Process(start.pid).children()
        worker.send_signal(signal.SIGKILL)
        stall = tc.wait_event("stall", 30)
        verdict = tc.wait_event("stall_diagnosis", 60)
        assert verdict.diagnosis == "dead_worker", (stall, verdict)
        assert str(worker.pid) in verdict.detail, verdict.detail
        tc.signal(signal.SIGINT)
        r = tc.wait(30)
    assert r.returncode == 130, r.describe()


@pytest.mark.timeout(150)
def test_long_validation_and_checkpoint_saves_are_not_stalls(tmp_path):
    """The train threshold is fixed at 3 s; each validation (800 images at imgsz 64 on CPU,
    about 6 s here) lasts longer, and val/save use their own learned thresholds: a run that really
    finishes has no stall event.  (The learned train threshold has a 30 s floor: a val
    longer than that would take minutes here.)"""
    train_timeout = 3
    job = write_ultralytics_job(tmp_path / "job", n_train=16, n_val=800, batch=1, epochs=1)
    preset = tmp_path / "Bval.toml"
    preset.write_text(
        (ROOT / "src" / "trainctl" / "presets" / "B.toml").read_text()
    )  # validation on, as shipped
    r = run_trainctl(
        [
            "run",
            str(job),
            "--json",
            "--preset",
            str(preset),
            "--stall-timeout",
            str(train_timeout),
            "--no-auto-recover",
        ],
        timeout=140,
    )
    assert r.returncode == 0, r.describe()
    assert r.of_type("stall") == [], r.of_type("stall")
    phases = r.of_type("phase")
    spans: dict[str, list[float]] = {}
    for ev, nxt in zip(phases, phases[1:]):
        spans.setdefault(ev.phase, []).append(nxt.ts - ev.ts)
    assert [p.phase for p in phases] == ["startup", "train", "val", "save", "val", "finished"], phases
    assert max(spans["val"]) > train_timeout, f"validation too short to prove anything: {spans}"
    assert [c.epoch for c in r.of_type("checkpoint") if c.ok] == [1]
    assert r.events[-1].state == "FINISHED"
