"""The warm spare end to end: real `trainctl run`, a real PyTorch loop with real DataLoader
workers that deadlocks, a restart that takes the parked spare (or must start cold because the
fallback preset's ``[env]`` differs), and the spare off (``--no-spare``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import PYTHON, start_trainctl, wait_until
from tests.helpers.hangs import STEADY, TRAIN_LOOP
from trainctl.core import events as E
from trainctl.inside.spare import MARK

WARM_AT_ONCE = {"TRAINCTL_SPARE_AFTER": "0"}  # the spare warmed at the first batch (30 s by default)

pytestmark = pytest.mark.e2e


def spares_of(run_dir: Path) -> list[psutil.Process]:
    """Live spare processes (parked, or released: its command line the attempt's then, its
    start-up environment still naming its FIFO) of this run."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            env = p.environ()
            spare = MARK in " ".join(p.info["cmdline"] or []) or "TRAINCTL_SPARE_FIFO" in env
            if spare and env.get("TRAINCTL_RUN_DIR") == str(run_dir):
                if p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def infos(events: list[E.Event], key: str) -> list[E.Info]:
    return [e for e in events if isinstance(e, E.Info) and e.key == key]


def startup_s(events: list[E.Event], attempt: int) -> float:
    """From the attempt's start event to its first progress."""
    start = next(e for e in events if e.type == "start" and e.attempt == attempt)
    progress = next(e for e in events if e.type == "progress" and e.ts > start.ts)
    return progress.ts - start.ts


def loop_args(tmp_path: Path, fallback: str) -> list[str]:
    ckpt = tmp_path / "ckpt.json"
    return [
        "run",
        "--json",
        "--preset",
        "A",
        "--fallback",
        fallback,
        "--stall-timeout",
        "6",
        "--resume-arg=--resume",
        f"--resume-arg={ckpt}",
        "--",
        PYTHON,
        "-u",
        str(TRAIN_LOOP),
        "--epochs",
        "2",
        "--batches",
        "6",
        "--hang-at",
        "2:3",
        "--hang-kind",
        "worker",
        "--hang-attempt",
        "1",
        "--checkpoint",
        str(ckpt),
    ]


@pytest.mark.timeout(150)
def test_a_restart_takes_the_parked_spare_and_the_run_finishes(tmp_path):
    with start_trainctl(loop_args(tmp_path, "B"), env={"TRAIN_MP_CONTEXT": "fork", **WARM_AT_ONCE}) as tc:
        parked = tc.wait_event(lambda e: e.type == "info" and e.key == "spare.parked", 90, "the parked spare")
        res = tc.wait(120)
    assert res.returncode == 0, res.describe()
    events = res.events
    assert "no GPU context" in parked.text and ": torch, torch._dynamo" in parked.text, parked.text
    assert " imported in " in parked.text, parked.text
    used = infos(events, "spare.used")
    assert used and used[0].text.startswith("attempt 2 started on the warm spare"), [
        e.text for e in infos(events, "")
    ]
    start2 = next(e for e in events if e.type == "start" and e.attempt == 2)
    assert f"(pid {start2.pid})" in parked.text  # attempt 2 is the spare's process
    assert startup_s(events, 2) < startup_s(events, 1)
    assert events[-1].type == "state" and events[-1].state == "FINISHED"
    wait_until(lambda: not spares_of(res.run_dir), 15, what="no spare left after the run")


@pytest.mark.timeout(150)
def test_a_fallback_preset_with_another_env_starts_cold_and_says_why(tmp_path):
    b = Path(__file__).parents[2] / "src" / "trainctl" / "presets" / "B.toml"
    fallback = tmp_path / "C.toml"
    fallback.write_text(b.read_text().replace("[env]", '[env]\nSPARE_TEST_MARK = "C"', 1))
    with start_trainctl(
        loop_args(tmp_path, str(fallback)), env={"TRAIN_MP_CONTEXT": "fork", **WARM_AT_ONCE}
    ) as tc:
        parked = tc.wait_event(lambda e: e.type == "info" and e.key == "spare.parked", 90, "the parked spare")
        res = tc.wait(120)
    assert res.returncode == 0, res.describe()
    events = res.events
    cold = infos(events, "spare.cold")
    assert [e.text for e in cold][:1] == [
        "attempt 2 started cold: the spare's environment differs in SPARE_TEST_MARK"
    ], cold
    assert not infos(events, "spare.used")
    start2 = next(e for e in events if e.type == "start" and e.attempt == 2)
    assert f"(pid {start2.pid})" not in parked.text
    assert events[-1].type == "state" and events[-1].state == "FINISHED"
    wait_until(lambda: not spares_of(res.run_dir), 15, what="no spare left after the run")


@pytest.mark.timeout(90)
def test_no_spare_means_no_spare_process_ever(tmp_path):
    args = ["run", "--json", "--no-spare", "--stall-timeout", "2", "--", PYTHON, "-u", str(STEADY)]
    args += [
        "--epochs",
        "1",
        "--batches",
        "30",
        "--hang-at",
        "1:5",
        "--hang-kind",
        "main",
        "--hang-attempt",
        "1",
    ]
    seen: list[str] = []
    with start_trainctl(args, env=WARM_AT_ONCE) as tc:  # a spare would be warmed at once
        while tc.proc.poll() is None:
            seen += [str(p.pid) for p in spares_of(tc.run_dir)]
            seen += [f.name for f in tc.run_dir.glob("spare-*")]
            time.sleep(0.1)
        res = tc.wait(60)
    assert res.returncode == 0, res.describe()
    assert seen == []
    assert [e.attempt for e in res.events if e.type == "start"] == [1, 2]  # it did restart
    assert not [e for e in res.events if isinstance(e, E.Info) and e.key.startswith("spare.")]


@pytest.mark.timeout(90)
def test_a_spare_does_not_outlive_its_agent_killed_with_sigkill(tmp_path):
    args = ["run", "--json", "--", PYTHON, "-u", str(STEADY), "--epochs", "1", "--batches", "4000"]
    with start_trainctl(args, env=WARM_AT_ONCE) as tc:
        parked = tc.wait_event(lambda e: e.type == "info" and e.key == "spare.parked", 60, "the parked spare")
        spare = psutil.Process(int(parked.text.split("(pid ")[1].split(")")[0]))
        assert spare in spares_of(tc.run_dir)
        agent = json.loads((tc.run_dir / "agent.json").read_text())["pid"]
        os.kill(agent, signal.SIGKILL)
        wait_until(lambda: not spares_of(tc.run_dir), 15, what="the spare gone with its agent")
        # the trainer itself goes on (held): a new agent adopts it; here it is just ended
        assert any(p.pid != spare.pid for p in tc.tree(scan_env=True))


@pytest.mark.timeout(120)
def test_a_restart_on_the_spare_shows_the_users_command_in_ps_and_pgrep(tmp_path):
    argv = [PYTHON, "-u", str(STEADY), "--epochs", "1", "--batches", "4000", "--hang-at", "1:5"]
    argv += ["--hang-kind", "main", "--hang-attempt", "1"]
    with start_trainctl(["run", "--json", "--stall-timeout", "2", "--", *argv], env=WARM_AT_ONCE) as tc:
        tc.wait_event(lambda e: e.type == "info" and e.key == "spare.used", 90, "the restart on the spare")
        start2 = tc.wait_event(lambda e: e.type == "start" and e.attempt == 2, 10, "attempt 2")
        found = subprocess.run(["pgrep", "-f", str(STEADY)], capture_output=True, text=True, timeout=10)
        assert str(start2.pid) in found.stdout.split(), found
        shown = Path(f"/proc/{start2.pid}/cmdline").read_bytes()  # then NULs: the room left over
        assert shown.rstrip(b"\0").split(b"\0") == [os.fsencode(a) for a in argv]
        ps = subprocess.run(
            ["ps", "-ww", "-o", "args=", "-p", str(start2.pid)], capture_output=True, text=True
        )
        assert ps.stdout.strip() == " ".join(argv)
