"""The dashboard's run picker as a person uses it, in a real terminal: tmux runs `trainctl
attach` on a real local run (its agent in tmux, a real PyTorch loop), `send-keys` types,
`capture-pane` reads.  A run on an ssh host (the loopback sshd box, named in hosts.toml) and a
real Slurm job waiting in the queue (--begin an hour from now): `g` lists all three, typing
narrows, enter switches the dashboard to the ssh run (its journal over ssh), then to the
queued one (PENDING with squeue's reason, no agent); `s` then `y` scancels it: nothing left
in squeue, the run STOPPED."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import PYTHON, read_journal, wait_until
from tests.e2e.test_remote_run import box, start_remote  # noqa: F401  (the loopback ssh box)
from tests.helpers.slurm import cancel_all, queue_of, require_slurm, wait_queue_empty
from tests.helpers.tmux_runs import TmuxRuns
from trainctl.hosts import tmux as tm

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not tm.tmux_available(), reason="tmux is not installed"),
]

ROOT = Path(__file__).resolve().parents[2]
LOOP = [
    sys.executable,
    str(ROOT / "tests" / "helpers" / "scripts" / "train_loop.py"),
    "--workers",
    "0",
    "--batch-time",
    "0.05",
    "--epochs",
    "1",
    "--batches",
    "2000",
]
PASSED_ENV = ("PATH", "HOME", "TRAINCTL_CACHE_DIR", "SLURM_CONF")
QUEUED = "pick-queued"


@pytest.fixture
def runs(tmp_path):
    require_slurm()
    r = TmuxRuns(tmp_path)
    try:
        yield r
    finally:
        cancel_all(f"trainctl-{QUEUED}")
        r.kill()


def trainctl(runs: TmuxRuns, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainctl", *args],
        env={**os.environ, **runs.env},
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def screen(runs: TmuxRuns) -> str:
    return runs.ui.capture("ui", lines=0)


def key(runs: TmuxRuns, *keys: str) -> None:
    subprocess.run(runs.ui.argv("send-keys", "-t", "=ui:", *keys), check=True, timeout=10)


def shows(runs: TmuxRuns, *texts: str, timeout: float = 20, what: str = "") -> str:
    try:
        return wait_until(
            lambda: all(t in (s := screen(runs)) for t in texts) and s,
            timeout,
            0.1,
            what=what or f"{texts} on screen",
        )
    except TimeoutError as e:
        raise AssertionError(f"{e}; the screen:\n{screen(runs)}") from None


def test_pick_an_ssh_run_then_the_queued_slurm_run_and_s_cancels_it(runs, box, tmp_path):  # noqa: F811 - the fixture, imported above
    script = tmp_path / "pick_remote.py"
    script.write_text("for i in range(1, 4):\n    print(f'step {i}/3 loss=0.5', flush=True)\n")
    remote_dir = start_remote(box, None, [PYTHON, "-u", str(script)])
    config = Path(runs.env["TRAINCTL_CONFIG_DIR"])
    config.mkdir(parents=True, exist_ok=True)
    (config / "hosts.toml").write_text(f'hosts = ["{box.dest}"]\n')
    local = trainctl(runs, "run", "--detach", "--name", "pick-local", "--", *LOOP)
    assert local.returncode == 0, local.stderr
    job = tmp_path / "queued.toml"
    job.write_text(
        f'kind = "command"\nname = "{QUEUED}"\n'
        f"command = {json.dumps([sys.executable, '-c', 'print(1)'])}\n"
        '[slurm]\ntime = "5:00"\noptions = ["--begin=now+3600"]\n'
    )
    queued = trainctl(runs, "run", str(job), "--detach")
    assert queued.returncode == 0, queued.stderr
    assert queue_of(f"trainctl-{QUEUED}")
    local_dir, queued_dir = (
        next(d for d in runs.run_dirs() if d.name.startswith(n)) for n in ("pick-local", QUEUED)
    )

    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env.update(runs.env, **box.client_env, TERM="xterm-256color")
    runs.ui.start_session(
        "ui",
        ["env", "-u", "COLUMNS", "-u", "LINES", sys.executable, "-m", "trainctl", "attach", str(local_dir)],
        cwd=str(ROOT),
        env=env,
        width=runs.width,
        height=runs.height,
    )
    shows(runs, "pick-local", "RUNNING", "● connected", what="the local run on the dashboard")

    # g: the picker lists the three (the one on screen marked ▶), the queued one with its reason
    key(runs, "g")
    text = shows(
        runs,
        "Follow which run?",
        "PENDING (BeginTime)",
        QUEUED,
        f"{box.dest}:{remote_dir}",
        what="the picker's rows",
    )
    lines = text.splitlines()
    assert any("▶" in ln and "pick-local" in ln and "RUNNING" in ln for ln in lines), text
    assert any(QUEUED in ln and "slurm " in ln for ln in lines), text
    assert any("pick_remote" in ln and "FINISHED" in ln and "3/" in ln for ln in lines), text
    # typing narrows the list (other users' Slurm runs may be listed too): enter follows it
    key(runs, "-l", "pick_remote")
    shows(runs, "1 run matching “pick_remote”", timeout=10)
    key(runs, "Enter")
    shows(runs, "pick_remote", " FINISHED ", "journal only", timeout=20, what="the ssh run on the dashboard")
    assert "Follow which run?" not in screen(runs) and "pick-local" not in screen(runs)

    key(runs, "g")
    shows(runs, "Follow which run?", QUEUED, what="the picker again")
    key(runs, "-l", QUEUED)
    shows(runs, f"1 run matching “{QUEUED}”", timeout=10)
    key(runs, "Enter")

    # the dashboard follows the queued run: PENDING, squeue's reason, no agent
    shows(
        runs,
        QUEUED,
        "○ Slurm job",
        "PENDING (BeginTime)",
        timeout=20,  # the header (it elides the rest first)
        what="the queued run on the dashboard",
    )
    assert "Follow which run?" not in screen(runs)
    # s: stop asks first, y: scancel; the run ends STOPPED, nothing left in squeue
    key(runs, "s")
    shows(runs, "Stop the run?", "scancel", timeout=10)
    key(runs, "y")
    try:
        last = wait_until(
            lambda: (
                (st := [e for e in read_journal(queued_dir) if e.type == "state"])
                and st[-1].state == "STOPPED"
                and st[-1]
            ),
            40,
            0.1,
            what="STOPPED journaled",
        )
    except TimeoutError as e:
        raise AssertionError(f"{e}; the screen:\n{screen(runs)}") from None
    assert "cancelled before it ran" in last.reason, last
    assert not wait_queue_empty(f"trainctl-{QUEUED}", 15)
    wait_until(
        lambda: " STOPPED " in (s := screen(runs)) and "Stop the run?" not in s,
        10,
        0.1,
        what="STOPPED on the dashboard",
    )
    # the local run went on, untouched by the switch
    from trainctl.agent.adopt import agent_running

    assert agent_running(local_dir)
    assert not {"STOPPED", "FAILED"} & {e.state for e in read_journal(local_dir) if e.type == "state"}
    # leave: q, and the local run stopped as a person would (the teardown then has nothing to kill)
    key(runs, "q")
    assert trainctl(runs, "ctl", str(local_dir), "stop", timeout=30).returncode == 0
