"""Issue 40, item 1: the trainer gets the environment of the shell that ran `trainctl run`,
not that of a tmux server started earlier from another shell; the values are never written
to the run directory nor shown in any process's command line, and `status --json` lists
the names the trainer got.

A real private tmux server started beforehand with another environment, a real agent in
it, a real trainer (a few progress lines, no torch)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import read_journal
from tests.helpers.hangs import wait_until
from tests.helpers.tmux_runs import TmuxRuns
from trainctl.hosts import tmux as tm

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not tm.tmux_available(), reason="tmux is not installed")]

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cret-4f1c9e"
SCRIPT = (
    "import os, sys, time\n"
    "e = os.environ\n"
    "print('env', e.get('CUDA_VISIBLE_DEVICES'), e.get('TC_SECRET') == sys.argv[1][::-1],"
    " e.get('TRAINCTL_DATA_DIR'), flush=True)\n"
    "for i in range(1, 41):\n    print(f'step {i}/40 loss=0.5', flush=True)\n    time.sleep(0.1)\n"
)


def trainctl(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainctl", *args],
        env=env,
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.timeout(90)
def test_the_callers_env_reaches_the_trainer_through_a_tmux_server_of_another_env(tmp_path):
    runs = TmuxRuns(tmp_path)
    try:
        other = {  # the shell that started the tmux server: another GPU, other state dirs
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", str(tmp_path)),
            "CUDA_VISIBLE_DEVICES": "0",
            "TRAINCTL_DATA_DIR": str(tmp_path / "elsewhere-data"),
            "TRAINCTL_RUNS_DIR": str(tmp_path / "elsewhere-runs"),
        }
        started = subprocess.run(
            [*runs.agents.argv("new-session", "-d", "-s", "other", "sleep 600")],
            env=other,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert started.returncode == 0, started.stderr
        script = tmp_path / "envtrain.py"
        script.write_text(SCRIPT)
        data_dir = tmp_path / "data"
        mine = {
            **os.environ,
            **runs.env,
            "CUDA_VISIBLE_DEVICES": "3",
            "TC_SECRET": SECRET,
            "TRAINCTL_DATA_DIR": str(data_dir),
        }
        r = trainctl(
            mine, "run", "--detach", "--name", "envrun", "--", sys.executable, str(script), SECRET[::-1]
        )
        assert r.returncode == 0 and "tmux session trainctl-envrun" in r.stdout, r
        run_dir = next(d for d in runs.run_dirs() if d.name.startswith("envrun-"))
        wait_until(
            lambda: any(e.type == "progress" for e in read_journal(run_dir)), 30, what="the first batch"
        )
        # No process shows the value: not the agent's argv, not tmux's, not the trainer's.
        for p in psutil.process_iter(["cmdline"]):
            assert SECRET not in " ".join(p.info["cmdline"] or ()), p
        status = trainctl(mine, "status", str(run_dir), "--json")
        assert status.returncode == 0, status
        got = json.loads(status.stdout)
        assert {"CUDA_VISIBLE_DEVICES", "TC_SECRET", "TRAINCTL_DATA_DIR"} <= set(got["env"]), got
        assert SECRET not in status.stdout
        log = (run_dir / "train.log").read_text()
        assert f"env 3 True {data_dir}" in log, log
        # The agent's own state paths are the caller's too: its run is where the caller's
        # TRAINCTL_RUNS_DIR says, nothing in the other shell's.
        assert not (tmp_path / "elsewhere-runs").exists()
        wait_until(lambda: any(e.type == "exit" for e in read_journal(run_dir)), 30, what="the end")
        assert not (run_dir / "env.fifo").exists()
        for f in run_dir.rglob("*"):
            if f.is_file():
                assert SECRET.encode() not in f.read_bytes(), f
    finally:
        runs.kill()


STEPS = (
    "import time\n"
    "for i in range(1, 121):\n    print(f'step {i}/120 loss=0.5', flush=True)\n    time.sleep(0.1)\n"
)


@pytest.mark.timeout(90)
def test_an_agent_that_replaces_a_killed_one_runs_in_its_tmux_session_which_goes_at_the_end(tmp_path):
    """Issue 40, item 7: `trainctl attach` adopts the run of a killed agent with a new agent
    in the same tmux session (not detached outside it); the finished run leaves no session."""
    runs = TmuxRuns(tmp_path)
    attach = None
    try:
        script = tmp_path / "steps.py"
        script.write_text(STEPS)
        env = {**os.environ, **runs.env}
        r = trainctl(env, "run", "--detach", "--name", "adopt7", "--", sys.executable, str(script))
        assert r.returncode == 0, r
        run_dir = next(d for d in runs.run_dirs() if d.name.startswith("adopt7-"))
        wait_until(
            lambda: any(e.type == "progress" for e in read_journal(run_dir)), 30, what="the first batch"
        )
        first = runs.agent_pid(run_dir)
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: not psutil.pid_exists(first) or psutil.Process(first).status() == "zombie", 10)
        attach = subprocess.Popen(
            [sys.executable, "-m", "trainctl", "attach", "--json", str(run_dir)],
            env=env,
            cwd=str(ROOT),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        second = wait_until(
            lambda: (p := runs.agent_pid(run_dir)) != first and p, 30, what="the adopting agent"
        )
        panes = runs.agents.pane_pids("trainctl-adopt7")
        assert panes.get(second) is False, (second, panes)  # its pane's live command: in tmux
        wait_until(
            lambda: any(e.type == "info" and e.key == "adopt" for e in read_journal(run_dir)),
            15,
            what="the adopting agent's word that it adopted",
        )
        _, err = attach.communicate(timeout=60)
        assert attach.returncode == 0, err.decode()[-2000:]
        assert [e.state for e in read_journal(run_dir) if e.type == "state"][-1] == "FINISHED"
        wait_until(lambda: not runs.agents.session_exists("trainctl-adopt7"), 20, what="the session to go")
    finally:
        if attach is not None and attach.poll() is None:
            attach.kill()
            attach.wait()
        runs.kill()
