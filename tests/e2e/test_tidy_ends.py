"""Issue 28, item 6: runs end tidily.  An agent in tmux whose run ended (finished, stopped)
takes its tmux session with it (no dead sessions piling up), and `trainctl ls` does not
count the user's own restart or stop as the run's last incident.

Real agents in a private tmux server, a real training loop (tests/helpers/scripts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import read_journal
from tests.helpers.hangs import wait_until
from tests.helpers.tmux_runs import TmuxRuns
from trainctl.hosts import tmux as tm

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not tm.tmux_available(), reason="tmux is not installed")]

ROOT = Path(__file__).resolve().parents[2]
STEPS = (
    "import sys, time\nn = int(sys.argv[1])\n"
    "for i in range(1, n + 1):\n    print(f'step {i}/{n} loss=0.5', flush=True)\n"
    "    time.sleep(0.05)\n"
)


def trainctl(runs: TmuxRuns, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainctl", *args],
        env={**os.environ, **runs.env},
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def state_is(run_dir: Path, state: str) -> bool:
    return any(e.type == "state" and e.state == state for e in read_journal(run_dir))


@pytest.mark.timeout(150)
def test_ended_runs_take_their_tmux_session_and_key_presses_are_no_incidents(tmux_runs, tmp_path):
    runs = tmux_runs
    script = tmp_path / "steps.py"  # progress lines trainctl reads, no torch: quick to start
    script.write_text(STEPS)
    done = {}
    for name, steps, end in (("tidy-fin", "60", "FINISHED"), ("tidy-stop", "100000", "STOPPED")):
        r = trainctl(runs, "run", "--detach", "--name", name, "--", sys.executable, str(script), steps)
        assert r.returncode == 0 and f"tmux session trainctl-{name}" in r.stdout, r
        run_dir = next(d for d in runs.run_dirs() if d.name.startswith(name + "-"))
        wait_until(
            lambda run_dir=run_dir: any(e.type == "progress" for e in read_journal(run_dir)),
            60,
            what="the first batch",
        )
        assert trainctl(runs, "ctl", str(run_dir), "restart").returncode == 0  # the `r` key
        wait_until(
            lambda run_dir=run_dir: sum(e.type == "start" for e in read_journal(run_dir)) == 2,
            60,
            what="attempt 2",
        )
        if end == "STOPPED":
            assert trainctl(runs, "ctl", str(run_dir), "stop").returncode == 0  # the `s` key
        wait_until(lambda run_dir=run_dir, end=end: state_is(run_dir, end), 60, what=f"{name} {end}")
        # The agent's pane goes with it: no dead session left for this job.
        wait_until(
            lambda name=name: not runs.agents.session_exists(f"trainctl-{name}"),
            20,
            what=f"the tmux session of {name} to go",
        )
        done[str(run_dir)] = end
    listed = json.loads(trainctl(runs, "ls", "--here", "--json").stdout)
    rows = {r["run_dir"]: r for r in listed if r["run_dir"] in done}
    assert {d: r["state"] for d, r in rows.items()} == done, listed
    for r in rows.values():  # a restart and a stop the user asked for are no incident
        assert r["incident"] is None, r
    restarts = [e for d in done for e in read_journal(Path(d)) if e.type == "restart"]
    assert len(restarts) == 2, restarts  # the restarts happened: they are in the journal
