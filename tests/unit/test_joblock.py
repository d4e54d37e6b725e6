"""The job lock counts a trainer left unsupervised (its agent and holder killed) as the job
running (issue 27, failure 3).  A real process stands for the trainer: its pid and create
time in the run's trainer-<N>.json, as the holder writes them."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest

from trainctl.store.joblock import JobBusy, JobLock, holder


def _orphan_run(tmp_path, proc: subprocess.Popen | None):
    run = tmp_path / "run-1"
    run.mkdir()
    pid = proc.pid if proc else 999999
    start = psutil.Process(pid).create_time() if proc else 1.0
    (run / "trainer-1.json").write_text(
        json.dumps(
            {
                "pid": pid,
                "pid_start": start,
                "holder_pid": 999998,
                "holder_start": 1.0,
                "attempt": 1,
                "returncode": None,
            }
        )
    )
    lock = JobLock("job")
    lock.acquire(run)  # the first run's agent took it ...
    lock.release()  # ... and it, and the holder that kept it, were killed
    return run


def test_a_free_lock_whose_run_has_a_live_trainer_is_busy_naming_it(tmp_path):
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run = _orphan_run(tmp_path, trainer)
        assert holder("job") == str(run)
        with pytest.raises(JobBusy) as e:
            JobLock("job").acquire(tmp_path / "run-2")
        assert f"pid {trainer.pid}" in str(e.value) and "unsupervised" in str(e.value)
        assert str(JobBusy.of("job", str(run))) == str(e.value)
        again = JobLock("job")
        again.acquire(run)  # its own run's adopting agent takes it
        again.release()
    finally:
        trainer.kill()
        trainer.wait()
    free = JobLock("job")
    free.acquire(tmp_path / "run-2")  # the trainer gone: free
    free.release()


def test_a_dead_or_reused_pid_does_not_hold_the_job(tmp_path):
    _orphan_run(tmp_path, None)
    assert holder("job") is None
    free = JobLock("job")
    free.acquire(tmp_path / "run-2")
    free.release()
