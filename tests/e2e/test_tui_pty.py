"""The dashboard in a real pty (issue 14): trainer text carrying a clipboard write (OSC 52),
a window-title change (OSC 0), malformed and C1 variants never reaches the terminal as a
sequence: the raw bytes the dashboard writes hold none of the payloads."""

from __future__ import annotations

import os
import pty
import select
import signal
import sys
import time

import pytest

from tests.e2e.conftest import ROOT
from trainctl.core import events as E
from trainctl.store.spec import RunSpec

pytestmark = pytest.mark.e2e

PAYLOADS = [
    "\x1b]52;c;UFdORUQtQ0xJUA==\x07",  # OSC 52: the clipboard
    "\x1b\x08]52;c;UFdORUQtQ0xJUA==\x1b\x08\\",  # malformed: ESC BS between
    "\x1b]0;PWNED-TITLE\x07",  # OSC 0: the window title
    "\x9d0;PWNED-TITLE\x9c",  # the same with C1 OSC/ST
    "\x1bc\x1b(0\x0e",  # reset, line drawing, shift out
]


def hostile_run(run_dir) -> None:
    run_dir.mkdir(mode=0o700)
    RunSpec(job_name="pty", kind="command", command=["x"]).save(run_dir / "spec.json")
    text = "CUDA error: out of memory " + "".join(PAYLOADS) + " marker-after"
    events = [
        E.Start(1.0, 1, 4242, None, ("x",)),
        E.Warning(2.0, "cuda.oom", "error", text, "advice " + PAYLOADS[0], source="trainer"),
        E.Exit(3.0, 1, None),
        E.State(3.1, "FAILED", "reason " + PAYLOADS[2]),
    ]
    (run_dir / "events.jsonl").write_text("".join(E.encode(e) + "\n" for e in events))


@pytest.mark.timeout(60)
def test_the_dashboard_in_a_real_pty_writes_no_trainer_sequence(tmp_path):
    run_dir = tmp_path / "run"
    hostile_run(run_dir)
    pid, fd = pty.fork()
    if pid == 0:  # the child: the dashboard on that run, in the pty
        os.environ.update(TERM="xterm-256color", COLUMNS="140", LINES="45")
        os.chdir(ROOT)
        os.execv(sys.executable, [sys.executable, "-m", "trainctl", "attach", str(run_dir)])
    out = b""
    try:
        end = time.monotonic() + 12
        while time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    out += os.read(fd, 65536)
                except OSError:
                    break
            if b"marker-after" in out and time.monotonic() > end - 8:
                break
        os.write(fd, b"q")
        time.sleep(1.0)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        os.close(fd)
    assert b"marker-after" in out, out[-2000:]  # the warning was drawn
    for bad in (b"UFdORUQtQ0xJUA", b"PWNED-TITLE", b"\x1b]52", b"\x1bc", b"\x1b(0", b"\x0e", b"\xc2\x9d"):
        assert bad not in out, (bad, out[max(0, out.find(bad) - 200) : out.find(bad) + 200])
