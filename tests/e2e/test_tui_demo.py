"""`trainctl demo` as a person uses it: the dashboard runs in a terminal (a private tmux
server, 160x48), the screen is read with capture-pane while a real YOLO training runs, and
keys are typed with send-keys: fall back to B (confirmed in the modal), then quit.  The
journal must agree with what the screen showed, and the run must go on after the quit."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import read_journal
from tests.helpers.hangs import wait_until
from tests.helpers.tmux_runs import TmuxRuns
from trainctl.hosts import tmux as tm

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not tm.tmux_available(), reason="tmux is not installed")]

ROOT = Path(__file__).resolve().parents[2]
PASSED_ENV = ("PATH", "HOME", "TRAINCTL_CACHE_DIR", "YOLO_OFFLINE", "YOLO_CONFIG_DIR")
BATCH = re.compile(r"Epoch (\d+)/(\d+)\s+Batch (\d+)/(\d+)")


@pytest.fixture
def runs(tmp_path):
    r = TmuxRuns(tmp_path)
    try:
        yield r
    finally:
        r.kill()


def screen(runs: TmuxRuns) -> str:
    return runs.ui.capture("ui", lines=0)


def counter(runs: TmuxRuns) -> tuple[int, int, int, int] | None:
    m = BATCH.search(screen(runs))
    return tuple(int(g) for g in m.groups()) if m else None


def key(runs: TmuxRuns, *keys: str) -> None:
    import subprocess

    subprocess.run(runs.ui.argv("send-keys", "-t", "=ui:", *keys), check=True, timeout=10)


@pytest.mark.timeout(240)
def test_demo_in_a_terminal_fallback_and_quit(runs):
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env.update(runs.env, TERM="xterm-256color", COLORTERM="truecolor")
    # No COLUMNS/LINES from the test process (pytest sets them): the pane's size rules.
    runs.ui.start_session(
        "ui",
        ["env", "-u", "COLUMNS", "-u", "LINES", sys.executable, "-m", "trainctl", "demo", "--epochs", "2"],
        cwd=str(ROOT),
        env=env,
        width=runs.width,
        height=runs.height,
    )

    # The real training shows up: epoch and batch counter, losses by name, changing.
    first = wait_until(lambda: counter(runs), 120, 0.2, what="the batch counter on screen")
    shown = screen(runs)
    for name in ("box_loss", "cls_loss", "dfl_loss", "preset A", "RUNNING", "attempt 1"):
        assert name in shown, f"{name!r} not on screen:\n{shown}"
    later = wait_until(
        lambda: (c := counter(runs)) and c != first and c, 30, 0.2, what="the batch counter to change"
    )
    assert later[:2] >= first[:2] and later != first
    (run_dir,) = runs.run_dirs()

    # f asks first; y confirms; the agent restarts the run under preset B.
    key(runs, "f")
    wait_until(lambda: "Fall back to preset B?" in screen(runs), 10, 0.1, what="the confirm modal")
    key(runs, "y")
    restart = wait_until(
        lambda: next((e for e in read_journal(run_dir) if e.type == "restart"), None),
        30,
        0.2,
        what="a restart event",
    )
    assert restart.preset == "B" and restart.reason, restart
    wait_until(
        lambda: any(e.type == "progress" and e.ts > restart.ts for e in read_journal(run_dir)),
        90,
        0.2,
        what="progress in attempt 2",
    )
    starts = [e for e in read_journal(run_dir) if e.type == "start"]
    assert [(s.attempt, s.preset) for s in starts] == [(1, "A"), (2, "B")]
    wait_until(
        lambda: "preset B" in screen(runs) and "attempt 2" in screen(runs),
        15,
        0.2,
        what="the header to show preset B, attempt 2",
    )
    wait_until(lambda: (c := counter(runs)) and c[2] > 0, 15, 0.2, what="attempt 2's batches on screen")

    # q leaves the dashboard, says how to come back, and the run goes on to its end.
    key(runs, "q")
    bye = wait_until(
        lambda: "Come back with" in (s := screen(runs)) and s, 15, 0.2, what="the goodbye message"
    )
    assert f"trainctl attach {run_dir}" in bye, bye
    wait_until(
        lambda: any(e.type == "state" and e.state == "FINISHED" for e in read_journal(run_dir)),
        150,
        0.5,
        what="the run to finish after the dashboard quit",
    )
    events = read_journal(run_dir)
    assert [e.returncode for e in events if e.type == "exit"][-1] == 0
    last = [e for e in events if e.type == "progress"][-1]
    assert last.epoch == last.epochs == 2, last
