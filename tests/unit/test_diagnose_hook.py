"""The diagnosis's ``on_sampled`` hook: the rescue save is asked once the CPU window is over,
so a main process that wakes to save reads as what it was, a deadlock, not a spin or
"unknown" (as it did when the save was asked on a timer that raced the window)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from trainctl.system.diagnose import diagnose

# A main process blocked forever that, on SIGUSR1 (a save request), works for 0.6 s.
BLOCKED = """
import signal, sys, threading, time
def save(*_):
    end = time.time() + 0.6
    while time.time() < end:
        pass
signal.signal(signal.SIGUSR1, save)
print("ready", flush=True)
threading.Event().wait()
"""


def test_a_save_asked_when_the_window_is_over_leaves_the_verdict_a_deadlock(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", BLOCKED], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        asked: list[float] = []

        def ask_for_a_save() -> None:
            asked.append(time.monotonic())
            proc.send_signal(signal.SIGUSR1)

        t0 = time.monotonic()
        diag = diagnose(proc.pid, tmp_path / "stacks", pyspy=False, on_sampled=ask_for_a_save)
        assert asked and asked[0] - t0 >= 0.9  # after the 1 s window, not within it
        assert diag.diagnosis == "deadlock", diag.detail
    finally:
        proc.kill()
        proc.wait()
