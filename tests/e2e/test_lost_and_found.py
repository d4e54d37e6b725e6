"""Every fault leaves a run that can be found and stopped (issue 27): a deleted run
directory, a deleted socket, an agent and holder both killed, two attach racing to adopt.
Real agents, holders and trainers (tests/helpers/scripts/steady.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import PYTHON, ROOT, run_trainctl, start_trainctl, wait_until
from tests.helpers import kernel_keeps_exit_status

pytestmark = pytest.mark.e2e

STEADY = str(Path(__file__).resolve().parents[1] / "helpers" / "scripts" / "steady.py")


def steady(batches: int, batch_time: float = 0.1) -> list[str]:
    return [PYTHON, STEADY, "--epochs", "1", "--batches", str(batches), "--batch-time", str(batch_time)]


def info_keys(events) -> list[str]:
    return [e.key for e in events if e.type == "info"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["deleted", "moved"])
def test_the_run_directory_deleted_or_moved_mid_run_is_made_again_and_the_training_goes_on(how):
    """Deleted, it used to end FAILED: the holder's status file gone, its trainer's clean
    exit read as a lost holder (-9), and the restart could not make side-2.jsonl.  Moved
    (`mv RUN RUN.old`), it was split in two: an empty directory made at the path, the
    history in RUN.old, and the same lost holder at the end."""
    with start_trainctl(["run", "--json", "--", *steady(40)]) as tc:
        tc.wait_event(lambda e: e.type == "progress" and (e.batch or 0) >= 5, 30, "batch 5")
        old = tc.run_dir.with_name(tc.run_dir.name + ".old")
        if how == "moved":
            os.rename(tc.run_dir, old)
        while how == "deleted" and tc.run_dir.exists():  # a file may come between list and rmdir
            shutil.rmtree(tc.run_dir, ignore_errors=True)
        r = tc.wait(90)
    assert r.returncode == 0, r.describe()
    assert r.of_type("state")[-1].state == "FINISHED", r.describe()
    assert len(r.of_type("start")) == 1, "restarted: " + r.describe()
    assert "run_dir.remade" in info_keys(r.events), r.describe()
    assert r.events[0].type == "start" and r.events[0].seq == 0  # the journal whole
    log = (r.run_dir / "train.log").read_text()
    missing = [b for b in range(1, 41) if f"batch={b}/40 " not in log]
    assert not missing, f"train.log lost batches {missing}"
    assert (old / "events.jsonl").exists() == (how == "moved")  # what was moved stays there


@pytest.mark.timeout(120)
def test_a_deleted_socket_is_made_again_and_status_and_stop_reach_the_agent():
    with start_trainctl(["run", "--json", "--", *steady(3000, 0.05)]) as tc:
        tc.wait_event("progress", 30)
        (tc.run_dir / "agent.sock").unlink()
        st = run_trainctl(["status", "--json", str(tc.run_dir)], 60)  # at once: it waits for it
        assert st.returncode == 0 and json.loads(st.stdout).get("live") is True, st.describe()
        stop = run_trainctl(["ctl", str(tc.run_dir), "stop"], 60)
        assert stop.returncode == 0, stop.describe()
        r = tc.wait(60)
    assert r.of_type("state")[-1].state == "STOPPED", r.describe()
    assert "socket.remade" in info_keys(r.events), r.describe()


def _end_adopter(run_dir: Path) -> None:
    """The agent a client started to adopt the run: gone at the test's end, whatever happened."""
    try:
        p = psutil.Process(json.loads((run_dir / "agent.json").read_text())["pid"])
        if "agent" not in p.cmdline():
            return  # not an agent: its pid was reused
    except (OSError, ValueError, KeyError, psutil.Error):
        return
    try:
        p.wait(30)
    except psutil.TimeoutExpired:
        with contextlib.suppress(psutil.Error):
            p.kill()
    except psutil.Error:
        pass


def _trainer_status(run_dir: Path, attempt: int = 1) -> dict:
    return json.loads((run_dir / f"trainer-{attempt}.json").read_text())


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.timeout(150)
def test_kill_9_of_agent_and_holder_leaves_a_trainer_found_locked_adopted_and_stopped():
    """Issue 27, failure 3.  It used to be: a chatty trainer dead of EPIPE at its next line
    (its holder had the only read end of its output), a quiet one running on unseen, attach
    exiting 3, the job lock free for a second run beside it."""
    name = f"orphan-{os.getpid()}"
    with start_trainctl(["run", "--json", "--name", name, "--", *steady(3000, 0.05)]) as tc:
        tc.wait_event(lambda e: e.type == "progress" and (e.batch or 0) >= 5, 30, "batch 5")
        st = _trainer_status(tc.run_dir)
        trainer = st["pid"]
        os.kill(tc.pid, signal.SIGKILL)
        os.kill(st["holder_pid"], signal.SIGKILL)
        wait_until(lambda: not _alive(st["holder_pid"]) and not _alive(tc.pid), 10, what="both dead")
        size = (tc.run_dir / "train.log").stat().st_size
        time.sleep(1.0)  # ~20 lines with no reader of its pipe but its own
        assert _alive(trainer), "the trainer died with its holder"

        status = run_trainctl(["status", "--json", str(tc.run_dir)], 60)
        found = json.loads(status.stdout).get("trainer")
        assert found == {"pid": trainer, "attempt": 1, "holder_alive": False}, status.describe()
        rows = json.loads(run_trainctl(["ls", "--here", "--json"], 60).stdout)
        row = next(r for r in rows if r["run_dir"] == str(tc.run_dir))
        assert row.get("trainer_pid") == trainer and row.get("unsupervised") is True, row

        second = run_trainctl(["run", "--json", "--name", name, "--", PYTHON, "-c", "pass"], 60)
        assert (
            second.returncode == 2 and f"pid {trainer}" in second.stderr and "unsupervised" in second.stderr
        ), second.describe()

        try:  # adopts it (an agent that outlives `ctl`: not run_trainctl, which kills its tree)
            stop = subprocess.run(
                [PYTHON, "-m", "trainctl", "ctl", str(tc.run_dir), "stop"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=90,
            )
            assert stop.returncode == 0, stop.stderr
            wait_until(lambda: not _alive(trainer), 60, what="the trainer stopped")
            wait_until(
                lambda: any(e.type == "state" and e.state == "STOPPED" for e in tc.events()),
                60,
                what="STOPPED journaled",
            )
        finally:
            _end_adopter(tc.run_dir)
    events = tc.events()
    assert "adopt.rehold" in info_keys(events), [e.type for e in events]
    assert (tc.run_dir / "train.log").stat().st_size > size  # its output read again meanwhile
    assert len([e for e in events if e.type == "start"]) == 1


@pytest.mark.skipif(not kernel_keeps_exit_status(), reason="the exit of a reaped trainer needs Linux 6.15+")
@pytest.mark.timeout(150)
def test_an_adopted_trainer_without_its_holder_that_runs_to_its_end_is_finished_not_restarted():
    """Not its holder's child, its holder killed: it used to be taken as killed (-9), and the
    whole training run again; its exit is read through a pidfd now (the kernel keeps it:
    Linux 6.15+), no guess from how far it got."""
    with start_trainctl(["run", "--json", "--", *steady(300, 0.05)]) as tc:
        tc.wait_event(lambda e: e.type == "progress" and (e.batch or 0) >= 5, 30, "batch 5")
        st = _trainer_status(tc.run_dir)
        os.kill(tc.pid, signal.SIGKILL)
        os.kill(st["holder_pid"], signal.SIGKILL)
        wait_until(lambda: not _alive(st["holder_pid"]) and not _alive(tc.pid), 10, what="both dead")
        try:
            attach = subprocess.run(
                [PYTHON, "-m", "trainctl", "attach", "--json", str(tc.run_dir)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert attach.returncode == 0, attach.stderr[-2000:]
        finally:
            _end_adopter(tc.run_dir)
    events = tc.events()
    assert [e.state for e in events if e.type == "state"][-1] == "FINISHED", [e.type for e in events]
    assert len([e for e in events if e.type == "start"]) == 1
    assert [e.returncode for e in events if e.type == "exit"] == [0]
    assert "exit.unknown" not in info_keys(events)


@pytest.mark.timeout(150)
def test_two_attach_on_an_orphaned_run_one_adopts_the_other_follows_it():
    """Issue 27, failure 12: the loser of the race to adopt used to exit 3 ("the agent was
    killed or crashed") while the winner's agent took the run on to FINISHED."""
    with start_trainctl(["run", "--json", "--", *steady(120, 0.05)]) as tc:
        tc.wait_event(lambda e: e.type == "progress" and (e.batch or 0) >= 5, 30, "batch 5")
        os.kill(tc.pid, signal.SIGKILL)
        wait_until(lambda: not _alive(tc.pid), 10, what="the agent dead")
        attaches = [
            subprocess.Popen(
                [PYTHON, "-m", "trainctl", "attach", "--json", str(tc.run_dir)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            for _ in range(2)
        ]
        try:
            outs = [p.communicate(timeout=90) for p in attaches]
        finally:
            for p in attaches:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            _end_adopter(tc.run_dir)
    codes = [p.returncode for p in attaches]
    assert codes == [0, 0], [(c, err[-600:]) for c, (_, err) in zip(codes, outs)]
    events = tc.events()
    assert events[-1].type == "state" and events[-1].state == "FINISHED"
    assert info_keys(events).count("adopt") == 1, "adopted twice"


CRASH_TWICE = """
import os, sys, time
attempt = int(os.environ.get("TRAINCTL_ATTEMPT") or 0)
for i in range(1, 6):
    print(f"epoch={attempt}/3 batch={i}/5 loss=0.5", flush=True)
    time.sleep(0.05)
sys.exit(3 if attempt < 3 else 0)
"""


@pytest.mark.timeout(120)
def test_an_agent_killed_in_its_back_off_its_successor_journals_no_second_restart(tmp_path):
    """Issue 27: the successor used to decide the restart again (journaled twice, charged
    twice to the budget).  Attempts 1 and 2 crash; the agent is killed in the 2 s back-off
    after attempt 2; `attach` adopts, waits out what is left of it, attempt 3 finishes."""
    script = tmp_path / "crash_twice.py"
    script.write_text(CRASH_TWICE)
    with start_trainctl(["run", "--json", "--", PYTHON, str(script)]) as tc:
        tc.wait_event(lambda e: e.type == "restart" and e.attempt == 3, 60, "the restart of attempt 3")
        os.kill(tc.pid, signal.SIGKILL)
        try:
            attach = subprocess.run(
                [PYTHON, "-m", "trainctl", "attach", "--json", str(tc.run_dir)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=90,
            )
        finally:
            _end_adopter(tc.run_dir)
    events = tc.events()
    assert attach.returncode == 0, attach.stderr[-1000:]
    restarts = [e.attempt for e in events if e.type == "restart"]
    assert restarts == [2, 3], restarts
    assert [e.attempt for e in events if e.type == "start"] == [1, 2, 3]
    assert events[-1].type == "state" and events[-1].state == "FINISHED"
