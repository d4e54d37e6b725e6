"""diagnose() on real hung processes: a DataLoader worker blocked forever, a spinning loop,
SIGSTOP, a dead worker.  Nothing here is mocked; py-spy really attaches."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import hangs
from trainctl.system.diagnose import diagnose, main_thread_frames
from trainctl.system.probes import TreeSampler
from trainctl.system.pyspy import find_pyspy

pytestmark = pytest.mark.e2e

needs_pyspy = pytest.mark.skipif(find_pyspy() is None, reason="py-spy is not installed")


def section(text: str, pid: int) -> str:
    """The part of a combined dump file under the header of `pid`."""
    m = re.search(rf"^=== pid {pid} .*?(?=^=== pid |\Z)", text, re.M | re.S)
    assert m, f"no section for pid {pid} in:\n{text[:2000]}"
    return m.group(0)


@needs_pyspy
@pytest.mark.timeout(120)
def test_dataloader_worker_blocked_forever_is_a_deadlock_then_a_killed_worker_is_dead(tmp_path):
    proc = hangs.start_script(
        hangs.TRAIN_LOOP, "--epochs", "1", "--batches", "8", "--hang-at", "1:5", "--hang-kind", "worker"
    )
    try:
        hangs.wait_for_line(proc, r"batch=4/8", timeout=90)
        sampler = TreeSampler()
        sampler.sample(proc.pid)  # the agent's tick before the stall
        time.sleep(0.5)
        d = diagnose(proc.pid, tmp_path / "stacks", sampler=sampler, tag="1-test")
        print(f"\ndiagnose on a real DataLoader deadlock: {d.elapsed_s:.2f}s ({d.detail})")
        assert d.diagnosis == "deadlock", d.detail
        assert d.cpu_percent is not None and d.cpu_percent < 10
        assert "DataLoader batch" in d.detail and "2 workers" in d.detail
        assert d.stacks == str(tmp_path / "stacks" / f"stall-1-test-{proc.pid}.txt")
        text = Path(d.stacks).read_text(encoding="utf-8")
        frames = main_thread_frames(section(text, proc.pid))
        assert any("_try_get_data" in f or "_get_data" in f for f in frames), frames
        workers = [s for s in d.processes if s.role == "worker"]
        assert len(workers) == 2
        blocked = [w for w in workers if "Batches.__getitem__" in section(text, w.pid)]
        assert len(blocked) == 1 and "Event.wait" in section(text, blocked[0].pid)
        assert oct(os.stat(d.stacks).st_mode & 0o777) == "0o600"
        # diagnose never kills: the trainer and both workers are still there
        assert proc.poll() is None and all(psutil.pid_exists(w.pid) for w in workers)

        idle = next(w for w in workers if w not in blocked)
        os.kill(idle.pid, signal.SIGKILL)
        time.sleep(0.2)
        d2 = diagnose(proc.pid, tmp_path / "stacks", sampler=sampler, tag="2-test", pyspy=False, sample_s=0.5)
        trainer_alive = any(s.role == "main" for s in d2.processes)
        print(f"after SIGKILL of worker {idle.pid}: {d2.diagnosis} ({d2.detail})")
        if trainer_alive:
            assert d2.diagnosis == "dead_worker", d2.detail
            assert str(idle.pid) in d2.detail
        # torch notices the dead worker itself within MP_STATUS_CHECK_INTERVAL (5 s) and the
        # trainer dies: the agent sees a crash, not a stall
        proc.wait(timeout=30)
        hangs.wait_for_line(proc, r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly", 5)
        assert proc.returncode != 0
    finally:
        hangs.kill_group(proc)


@needs_pyspy
@pytest.mark.timeout(60)
def test_spinning_loop_is_spin(tmp_path):
    with hangs.running(hangs.MIOPEN_SPIN) as proc:
        hangs.wait_for_line(proc, r"MIOpen\(HIP\): Warning \[SQLiteBase\] Missing system database", 30)
        time.sleep(0.3)
        d = diagnose(proc.pid, tmp_path, tag="spin")
        assert d.diagnosis == "spin", d.detail
        assert "main process busy" in d.detail
        frames = main_thread_frames(section(Path(d.stacks).read_text(), proc.pid))
        assert frames and "miopen_spin.py" in frames[0]
        assert proc.poll() is None


@needs_pyspy
@pytest.mark.timeout(60)
def test_sigstopped_trainer_is_stopped_and_py_spy_does_not_hang(tmp_path):
    with hangs.running(hangs.STEADY, "--hang-at", "1:3", "--hang-kind", "stop") as proc:
        hangs.wait_for_line(proc, r"batch=2/30", 30)
        hangs.wait_until(
            lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED, timeout=10, what="state T"
        )
        t0 = time.monotonic()
        d = diagnose(proc.pid, tmp_path, tag="stop")
        assert time.monotonic() - t0 < 15
        assert d.diagnosis == "stopped", d.detail
        assert f"kill -CONT {proc.pid}" in d.detail
        text = section(Path(d.stacks).read_text(), proc.pid)
        assert "--nonblocking" in text and "MainThread" in text
        assert psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED  # left as it was


@pytest.mark.timeout(60)
def test_killed_multiprocessing_worker_is_dead_worker(tmp_path):
    with hangs.running(hangs.STEADY, "--mp-workers", "1", "--batch-time", "0.05") as proc:
        worker = int(hangs.wait_for_line(proc, r"workers pids=(\d+)", 30).group(1))
        hangs.wait_for_line(proc, r"batch=3/30", 30)
        sampler = TreeSampler()
        assert worker in {s.pid for s in sampler.sample(proc.pid) if s.role == "worker"}
        os.kill(worker, signal.SIGKILL)
        d = diagnose(proc.pid, tmp_path, sampler=sampler, tag="dead", pyspy=find_pyspy() is not None)
        assert d.diagnosis == "dead_worker", d.detail
        assert f"worker {worker} died" in d.detail
        assert proc.poll() is None


@pytest.mark.timeout(60)
def test_main_thread_blocked_is_deadlock_and_a_missing_py_spy_is_explained(tmp_path, monkeypatch):
    with hangs.running(hangs.STEADY, "--hang-at", "1:2", "--hang-kind", "main") as proc:
        hangs.wait_for_line(proc, r"batch=1/30", 30)
        monkeypatch.setattr(sys, "executable", str(tmp_path / "no-venv" / "python"))
        monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
        assert find_pyspy() is None
        time.sleep(0.3)
        d = diagnose(proc.pid, tmp_path / "stacks", tag="nospy", sample_s=0.5)
        assert d.diagnosis == "deadlock", d.detail
        assert "py-spy not found" in d.detail
        assert "py-spy not found" in Path(d.stacks).read_text()


@needs_pyspy
@pytest.mark.timeout(60)
def test_a_dump_of_a_moving_process_is_a_snapshot_and_an_unwritable_dir_costs_only_the_file(tmp_path):
    proc = hangs.start_script(hangs.TRAIN_LOOP, "--epochs", "1", "--batches", "400", "--batch-time", "0.05")
    try:
        hangs.wait_for_line(proc, r"batch=3/400", timeout=60)
        d = diagnose(proc.pid, tmp_path / "stacks", tag="manual-1", snapshot=True)
        assert d.detail.startswith("a snapshot of") and "deadlock" not in d.detail, d.detail
        text = Path(d.stacks).read_text()
        assert os.path.basename(d.stacks).startswith("snapshot-") and "not a verdict" in text
        (tmp_path / "blocked").write_text("a file where the stacks directory should be")
        d = diagnose(proc.pid, tmp_path / "blocked", tag="2", pyspy=True)
        assert d.stacks is None and "could not be written" in d.detail, d.detail
    finally:
        hangs.kill_group(proc)
