"""Issue 28, item 3: `make demo` as a newcomer runs it, in a terminal (a private tmux server):
the demo is long enough to try every key (its default length, measured from one whole
epoch, not waited for), says how to make it shorter or longer, and stopping it from the
dashboard (s, y, then q) ends `make` quietly: exit 0, no `Error 130`, the run said STOPPED
(not "agent running"), and how to put `trainctl` on the PATH said at the end.

`make` runs the Makefile's own demo target, with this test's virtual environment as VENV
(`-o` its stamp: nothing is installed)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import read_journal
from tests.e2e.test_tui_demo import BATCH, PASSED_ENV, key
from tests.helpers.hangs import wait_until
from tests.helpers.tmux_runs import TmuxRuns
from trainctl.config.demo import DEMO_EPOCHS
from trainctl.hosts import tmux as tm

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not tm.tmux_available() or not shutil.which("make"), reason="needs tmux and make"),
]

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent


def screen(runs: TmuxRuns, lines: int = 0) -> str:
    return runs.ui.capture("ui", lines=lines)


@pytest.mark.timeout(600)
def test_make_demo_is_minutes_long_and_a_stop_is_no_make_error(tmux_runs):
    runs = tmux_runs
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env.update(runs.env, TERM="xterm-256color")
    make = f"make -o {VENV}/.installed VENV={VENV} demo; echo make-exit=$?"
    runs.ui.start_session(
        "ui",
        ["env", "-u", "COLUMNS", "-u", "LINES", "-u", "MAKEFLAGS", "sh", "-c", make],
        cwd=str(ROOT),
        env=env,
        width=runs.width,
        height=runs.height,
    )

    m = wait_until(lambda: BATCH.search(screen(runs)), 300, 0.2, what="the batch counter on screen")
    assert int(m.group(2)) == DEMO_EPOCHS, m.group(0)  # `make demo` gives the default length
    (run_dir,) = runs.run_dirs()
    # Where Ultralytics writes the results: on the Progress panel's border (the job's runner)
    wait_until(lambda: "results " in screen(runs), 60, 0.2, what="the results directory on screen")

    # Its length, from its own pace: one whole epoch (its batches, its validation, its
    # workers' start), from the first batch of epoch 2 to the first of epoch 3.
    def epoch_starts():
        prog = [e for e in read_journal(run_dir) if e.type == "progress" and e.epoch is not None]
        starts = {}
        for e in prog:
            starts.setdefault(e.epoch, e)
        return (starts[2], starts[3]) if 3 in starts else None

    a, b = wait_until(epoch_starts, 180, 0.5, what="the first batch of epoch 3")
    length_s = (b.ts - a.ts) * b.epochs
    print(f"make demo: {b.epochs} epochs of {b.batches} batches, about {length_s:.0f} s at this pace")
    assert length_s >= 90, f"the demo would be over in {length_s:.0f} s: too short to try the keys"

    # A normal stop: s, confirmed, then q.  make must not call it an error.
    key(runs, "s")
    wait_until(lambda: "Stop the run?" in screen(runs), 15, 0.1, what="the confirm modal")
    key(runs, "y")
    wait_until(
        lambda: any(e.type == "state" and e.state == "STOPPED" for e in read_journal(run_dir)),
        60,
        0.2,
        what="the run to stop",
    )
    wait_until(lambda: "STOPPED" in screen(runs), 15, 0.2, what="STOPPED on screen")
    key(runs, "q")
    end = wait_until(
        lambda: "make-exit=" in (s := screen(runs, lines=200)) and s, 30, 0.2, what="make to end"
    )
    assert "make-exit=0" in end, end
    assert "The run is STOPPED" in end, end  # q on an ended run says so,
    assert "agent running" not in end and "agent runs in" not in end, end  # not that it runs
    assert "Error 130" not in end and "***" not in end, end
    assert ". " + str(VENV) + "/bin/activate" in end, end  # how to run trainctl next
    mine = VENV / "bin" / "trainctl"
    on_path = shutil.which("trainctl", path=env["PATH"])
    typed = "trainctl" if on_path and os.path.samefile(on_path, mine) else str(mine)
    assert f"{typed} attach {run_dir}" in end, end  # a come-back line that works
    assert "EPOCHS=N" in end and "--epochs N" in end, end  # how to change the length
