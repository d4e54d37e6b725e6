"""Stalls the tree proves, caught in seconds with the defaults (core/stall_certain.py): real
DataLoader workers stopped with SIGSTOP, a queue's producer killed with SIGKILL (a zombie
next to a blocked trainer), a worker deadlock after epochs whose non-persistent workers were
replaced (no false alarm at their ends); and a trainer stopped by a tracer (ptrace), which
is no hang: the threshold decides there, as before.  (A DataLoader worker killed with
SIGKILL ends the trainer at once: torch says so itself, test_agent_detection.py.)"""

from __future__ import annotations

import ctypes
import os
import signal

import psutil
import pytest

from tests.e2e.conftest import PYTHON, start_trainctl
from tests.helpers.hangs import STEADY, TRAIN_LOOP, wait_until

pytestmark = pytest.mark.e2e

PTRACE_ATTACH, PTRACE_DETACH = 16, 17
WALL = 0x40000000  # __WALL: wait for a traced process that is not our child
LONG = ("--epochs", "1", "--batches", "2000", "--batch-time", "0.02")  # ~40 s: the hang comes first


def _trainctl(script, *args: str, options: tuple[str, ...] = ()):
    """trainctl run, defaults but auto-recovery (off: the stalled tree stays to be looked at)."""
    return start_trainctl(["run", "--json", "--no-auto-recover", *options, "--", PYTHON, str(script), *args])


def _at_batch_20(tc):
    start = tc.wait_event("start", 30)
    tc.wait_event(lambda e: e.type == "progress" and (e.batch or 0) >= 20, 60, "batch 20")
    return start


def _stall_of(tc):
    """The stall, and the last progress event before it."""
    stall = tc.wait_event("stall", 40)
    return stall, [e for e in tc.events() if e.type == "progress" and e.seq < stall.seq][-1]


def _stop(tc) -> None:
    tc.signal(signal.SIGINT)  # the agent kills the tree, stopped processes included (SIGCONT)
    r = tc.wait(30)
    assert r.returncode == 130, r.describe()
    assert len(r.of_type("stall")) == 1, r.of_type("stall")


@pytest.mark.timeout(90)
def test_dataloader_workers_stopped_with_sigstop_are_caught_within_5_s_of_the_last_batch():
    with _trainctl(TRAIN_LOOP, *LONG) as tc:
        start = _at_batch_20(tc)
        workers = psutil.Process(start.pid).children()
        assert len(workers) == 2, workers
        for w in workers:
            w.send_signal(signal.SIGSTOP)
        stall, _ = _stall_of(tc)
        assert stall.certain == "stopped" and "every worker stopped" in stall.detail, stall
        assert stall.idle_s <= 5.0 and stall.threshold_s == 3.0, stall  # idle: since the last batch
        assert tc.wait_event("stall_diagnosis", 60).diagnosis == "stopped"
        _stop(tc)


@pytest.mark.timeout(60)
def test_a_producer_killed_with_sigkill_next_to_its_blocked_trainer_is_caught_within_5_s():
    with _trainctl(STEADY, *LONG, "--mp-workers", "1") as tc:
        start = _at_batch_20(tc)
        (worker,) = psutil.Process(start.pid).children()
        worker.send_signal(signal.SIGKILL)
        stall, _ = _stall_of(tc)
        assert stall.certain == "worker_gone", stall
        assert f"worker {worker.pid} died (zombie)" in stall.detail, stall
        assert stall.idle_s <= 5.0, stall
        _stop(tc)


@pytest.mark.timeout(90)
def test_a_worker_deadlock_after_epochs_of_replaced_workers_is_certain_within_12_s():
    """persistent_workers=False (the DataLoader's default): each epoch's end replaces both
    workers; none of those three ends is a stall.  The deadlock in epoch 4 is."""
    hang = (
        "--epochs",
        "4",
        "--batches",
        "15",
        "--batch-time",
        "0.05",
        "--hang-at",
        "4:5",
        "--hang-kind",
        "worker",
    )
    with _trainctl(TRAIN_LOOP, *hang) as tc:
        stall, last = _stall_of(tc)
        assert (last.epoch, last.batch) == (4, 4), last
        assert stall.certain == "deadlock" and "DataLoader wait" in stall.detail, stall
        assert stall.idle_s <= 12.0 and stall.threshold_s == 10.0, stall
        _stop(tc)


@pytest.mark.timeout(60)
def test_a_trainer_stopped_by_a_tracer_is_no_certain_hang():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    with _trainctl(STEADY, *LONG, options=("--stall-timeout", "5")) as tc:
        start = _at_batch_20(tc)
        assert libc.ptrace(PTRACE_ATTACH, start.pid, None, None) == 0, os.strerror(ctypes.get_errno())
        try:
            os.waitpid(start.pid, WALL)  # its attach stop: state t, a debugger's
            wait_until(lambda: psutil.Process(start.pid).status() == psutil.STATUS_TRACING_STOP, 5)
            stall, _ = _stall_of(tc)
        finally:
            libc.ptrace(PTRACE_DETACH, start.pid, None, None)
        # stopped without a tracer it would have been certain after 3 s
        assert stall.certain is None and stall.threshold_s == 5.0 and stall.idle_s >= 5.0, stall
        _stop(tc)
