"""Recovery end to end: real `trainctl run` processes supervising real hanging trainers.

The trainers are the helper scripts (tests/helpers/scripts): ``train_loop.py`` is a real
PyTorch loop with a 2-worker DataLoader whose worker deadlocks on an Event; ``steady.py``
is the same shape without torch (starts in ~50 ms) for the policy and command tests.
trainctl detects the stall, kills the whole tree, and restarts — under the fallback preset,
from the checkpoint — by itself; the tests watch the journal and the process table.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import PYTHON, run_trainctl, start_trainctl, wait_until
from tests.helpers.hangs import STEADY, TRAIN_LOOP
from trainctl.core import events as E

pytestmark = pytest.mark.e2e


# ---------------------------------------------------------------------- helpers
def attempt(events: list[E.Event], n: int) -> list[E.Event]:
    """The events of attempt ``n``: from its start event up to the next start."""
    out, current = [], 0
    for ev in events:
        if ev.type == "start":
            current = ev.attempt
        if current == n:
            out.append(ev)
    return out


def first(events: list[E.Event], kind: str, after: float = 0.0, **fields) -> E.Event | None:
    for ev in events:
        if ev.type == kind and ev.ts >= after and all(getattr(ev, k) == v for k, v in fields.items()):
            return ev
    return None


def of(events: list[E.Event], kind: str) -> list:
    return [ev for ev in events if ev.type == kind]


def ctl(run_dir: Path, *args: str) -> dict:
    res = run_trainctl(["ctl", str(run_dir), *args], timeout=30)
    assert res.returncode == 0, f"trainctl ctl {' '.join(args)}: {res.stderr}"
    return json.loads(res.stdout)


def tree_of(pid: int) -> dict[int, psutil.Process]:
    """The process ``pid`` and its descendants now (Process objects: safe against pid reuse)."""
    try:
        root = psutil.Process(pid)
        return {p.pid: p for p in [root, *root.children(recursive=True)]}
    except psutil.Error:
        return {}


def alive(procs) -> list[str]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid} {' '.join(p.cmdline())[:100]}")
        except psutil.Error:
            continue
    return out


def assert_order(events: list[E.Event], *expected: str) -> None:
    """``expected`` types appear in this order (other events may come between)."""
    seen = [ev.type for ev in events]
    i = 0
    for ev_type in seen:
        if i < len(expected) and ev_type == expected[i]:
            i += 1
    assert i == len(expected), f"expected {expected} in order, got {seen}"


# ---------------------------------------------------------------------- the unattended case
@pytest.mark.timeout(120)
def test_worker_deadlock_under_A_restarts_under_B_from_the_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt.json"
    args = [
        "run",
        "--json",
        "--preset",
        "A",
        "--fallback",
        "B",
        "--stall-timeout",
        "6",
        "--resume-arg=--resume",
        f"--resume-arg={ckpt}",
        "--",
        PYTHON,
        "-u",
        str(TRAIN_LOOP),
        "--epochs",
        "3",
        "--batches",
        "8",
        "--hang-at",
        "2:4",
        "--hang-kind",
        "worker",
        "--hang-attempt",
        "1",
        "--checkpoint",
        str(ckpt),
    ]
    # The loop applies the preset's workers (A: 2, B: 0); fork instead of A's spawn keeps
    # the test fast (spawned workers import torch again every epoch).
    with start_trainctl(args, env={"TRAIN_MP_CONTEXT": "fork"}) as tc:
        start1 = tc.wait_event(lambda e: e.type == "start" and e.attempt == 1, 60, "attempt 1")
        # Attempt 1's whole tree (trainer and every DataLoader worker it made), until the stall.
        first_tree: dict[int, psutil.Process] = {}
        deadline = time.monotonic() + 60
        while first(tc.events(), "stall") is None:
            first_tree.update(tree_of(start1.pid))
            assert time.monotonic() < deadline, tc.result().describe()
            time.sleep(0.05)
        tc.wait_event(lambda e: e.type == "start" and e.attempt == 2, 30, "attempt 2")
        # Nothing of attempt 1 is left once attempt 2 runs.
        assert alive(first_tree.values()) == []
        res = tc.wait(60)

    assert res.returncode == 0, res.describe()
    workers = [p for pid, p in first_tree.items() if pid != start1.pid]
    assert len(workers) >= 2, "attempt 1 should have had its 2 DataLoader workers"
    events = res.events
    one, two = attempt(events, 1), attempt(events, 2)
    stall = first(one, "stall")
    assert stall.phase == "train" and first(one, "stall_diagnosis").diagnosis == "deadlock", stall
    restart = first(one, "restart")
    assert (restart.attempt, restart.preset, restart.resume_from) == (2, "B", str(ckpt))
    assert "falling back from A to B" in restart.reason
    assert_order(one, "stall", "restart")
    assert_order(two, "start", "progress", "exit")
    assert two[0].preset == "B" and tuple(two[0].command[-2:]) == ("--resume", str(ckpt))
    exits = [e.returncode for e in of(events, "exit")]
    assert len(exits) == 2 and exits[0] < 0 and exits[1] == 0, exits
    assert events[-1].type == "state" and events[-1].state == "FINISHED"
    # Attempt 2 resumed after epoch 1 (the checkpoint), under B's workers = 0.
    progress2 = of(two, "progress")
    assert progress2[0].epoch == 2 and progress2[-1].epoch == 3
    log = (res.run_dir / "train.log").read_text()
    assert re.search(r"attempt=1 workers=2 context=fork resume_epoch=0", log)
    assert re.search(r"attempt=2 workers=0 context=\S+ resume_epoch=1", log)
    assert_goodput_and_report(res.run_dir)


def assert_goodput_and_report(run_dir: Path) -> None:
    """The goodput of a run with a stall and a restart: every bucket of the recovery has
    time, they sum to the wall time, `status --json` says the same, and `trainctl report`
    of the finished run writes its page and its Markdown."""
    from trainctl.core.goodput import Goodput
    from trainctl.store.journal import read_events

    events = list(read_events(run_dir / "events.jsonl"))
    g = Goodput()
    for e in events:
        g.apply(e)
    t = g.totals()
    b = t["buckets"]
    assert abs(t["productive_s"] + sum(b.values()) - t["wall_s"]) <= 0.01 * t["wall_s"], t
    assert abs(t["wall_s"] - (events[-1].ts - events[0].ts)) <= 0.01 * t["wall_s"], t
    assert b["detection"] >= 4.0, t  # a 6 s stall timeout: most of it waiting for the hang's sign
    assert b["restart"] > 0 and b["startup"] > 0 and t["productive_s"] > 0, t
    assert b["redone"] > 0, t  # attempt 1 hung at epoch 2 batch 4; attempt 2 redid epoch 2 from its start
    status = run_trainctl(["status", str(run_dir), "--json"], timeout=30)
    said = json.loads(status.stdout)["goodput"]
    assert said["wall_s"] == t["wall_s"] and said["buckets"] == b, (said, t)
    res = run_trainctl(["report", str(run_dir)], timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == str(run_dir / "report.html"), res.stderr
    page = (run_dir / "report.html").read_text()
    assert page.count("<svg") >= 3 and "deadlock" in page and "falling back from A to B" in page
    md = run_trainctl(["report", str(run_dir), "--md", "--stdout"], timeout=60)
    assert md.returncode == 0 and "## Goodput" in md.stdout and "| stall |" in md.stdout


# ---------------------------------------------------------------------- orphans
@pytest.mark.timeout(60)
def test_workers_orphaned_by_a_dead_trainer_are_swept_before_the_restart(tmp_path):
    """The trainer dies (SIGKILL, as from the OOM killer) and leaves its worker processes
    behind: they are re-parented to the agent (a child subreaper) and killed with the tree."""
    args = [
        "run",
        "--json",
        "--stall-timeout",
        "5",
        "--",
        PYTHON,
        "-u",
        str(STEADY),
        "--epochs",
        "1",
        "--batches",
        "40",
        "--batch-time",
        "0.05",
        "--mp-workers",
        "2",
    ]
    with start_trainctl(args) as tc:
        start1 = tc.wait_event(lambda e: e.type == "start" and e.attempt == 1, 30, "attempt 1")
        tc.wait_event("progress", 30)
        workers = wait_until(
            lambda: [p for p in tree_of(start1.pid).values() if p.pid != start1.pid],
            10,
            what="attempt 1's workers",
        )
        assert len(workers) == 2
        os.kill(start1.pid, signal.SIGKILL)
        tc.wait_event(lambda e: e.type == "start" and e.attempt == 2, 30, "attempt 2")
        assert alive(workers) == []
        res = tc.wait(30)
    assert res.returncode == 0, res.describe()
    exits = of(res.events, "exit")
    assert (exits[0].returncode, exits[0].signal) == (-signal.SIGKILL, "SIGKILL")


# ---------------------------------------------------------------------- the budget
@pytest.mark.timeout(90)
def test_a_trainer_that_hangs_every_time_fails_after_the_budget_with_growing_delays():
    args = [
        "run",
        "--json",
        "--stall-timeout",
        "2",
        "--max-restarts",
        "3",
        "--",
        PYTHON,
        "-u",
        str(STEADY),
        "--epochs",
        "1",
        "--batches",
        "50",
        "--hang-at",
        "1:5",
        "--hang-kind",
        "main",
    ]
    res = run_trainctl(args, timeout=80)
    assert res.returncode == 1, res.describe()
    events = res.events
    restarts = of(events, "restart")
    starts = of(events, "start")
    assert len(starts) == len(restarts) + 1 >= 3
    delays = [r.delay_s for r in restarts]
    assert delays == sorted(delays) and delays[0] < delays[-1], delays
    for r in restarts:  # each attempt started only after its delay
        nxt = first(starts, "start", attempt=r.attempt)
        assert nxt.ts - r.ts >= r.delay_s - 0.05, (r, nxt)
    assert len(of(events, "stall")) == len(starts)
    final = events[-1]
    assert final.type == "warning" and final.id == "trainctl.failed" and final.severity == "fatal"
    state = of(events, "state")[-1]
    assert state.state == "FAILED" and state.reason == final.text
    assert "giving up" in state.reason or "budget" in state.reason


# ---------------------------------------------------------------------- kill during save
@pytest.mark.timeout(90)
def test_a_restart_during_a_checkpoint_save_waits_for_the_save_to_end(tmp_path):
    ckpt = tmp_path / "ckpt.json"
    args = [
        "run",
        "--json",
        "--preset",
        "A",
        "--stall-timeout",
        "20",
        "--resume-arg=--resume",
        f"--resume-arg={ckpt}",
        "--",
        PYTHON,
        "-u",
        str(TRAIN_LOOP),
        "--epochs",
        "3",
        "--batches",
        "5",
        "--workers",
        "0",
        "--checkpoint",
        str(ckpt),
        "--save-time",
        "4",
    ]
    with start_trainctl(args) as tc:
        save = tc.wait_event(lambda e: e.type == "phase" and e.phase == "save", 60, "the save phase")
        ctl(tc.run_dir, "restart")
        exit1 = tc.wait_event("exit", 30)
        # The file the trainer was writing in place when the restart came is whole.
        assert json.loads(ckpt.read_text()) == {"epoch": 1}
        tc.wait_event(lambda e: e.type == "progress" and e.ts > exit1.ts, 60, "attempt 2's progress")
        ctl(tc.run_dir, "stop")
        res = tc.wait(30)
    assert res.returncode == 130, res.describe()
    one = attempt(res.events, 1)
    wait_info = first(one, "info", key="save_wait")
    assert wait_info is not None and "waiting for the checkpoint save" in wait_info.text
    save_end = first(one, "phase", after=save.ts + 0.001, phase="train")
    stopping = first(one, "state", state="STOPPING")
    assert save.ts < wait_info.ts < save_end.ts <= stopping.ts < exit1.ts
    assert save_end.ts - save.ts >= 3.5  # the save really took its 4 s
    restart = first(one, "restart")
    assert (restart.preset, restart.resume_from, restart.delay_s) == ("A", str(ckpt), 0.0)
    assert re.search(
        r"attempt=2 workers=0 context=\S+ resume_epoch=1", (res.run_dir / "train.log").read_text()
    )


# ---------------------------------------------------------------------- user commands
@pytest.mark.timeout(120)
def test_user_commands_fallback_switch_preset_and_auto_recover(tmp_path):
    """fallback and switch_preset restart at once and are not charged to the budget
    (--max-restarts 1 still allows the automatic restart at the end); with auto-recovery
    off a stall is reported but nothing restarts until it is switched back on."""
    ckpt = tmp_path / "ckpt.json"
    args = [
        "run",
        "--json",
        "--preset",
        "A",
        "--fallback",
        "B",
        "--stall-timeout",
        "2",
        "--max-restarts",
        "1",
        "--resume-arg=--resume",
        f"--resume-arg={ckpt}",
        "--",
        PYTHON,
        "-u",
        str(STEADY),
        "--epochs",
        "100000",
        "--batches",
        "10",
        "--batch-time",
        "0.05",
        "--checkpoint",
        str(ckpt),
    ]

    def start(tc, n):
        return tc.wait_event(lambda e: e.type == "start" and e.attempt == n, 30, f"attempt {n}")

    def progress_after(tc, ev, epoch_above=0):
        return tc.wait_event(
            lambda e: e.type == "progress" and e.ts > ev.ts and e.epoch > epoch_above, 30, "progress"
        )

    with start_trainctl(args) as tc:
        progress_after(tc, start(tc, 1), epoch_above=1)  # a checkpoint exists
        assert ctl(tc.run_dir, "fallback") == {"restart": "now", "preset": "B"}
        s2 = start(tc, 2)
        assert s2.preset == "B"
        progress_after(tc, s2)
        assert ctl(tc.run_dir, "switch_preset", "--preset", "A") == {"restart": "now", "preset": "A"}
        s3 = start(tc, 3)
        assert s3.preset == "A"
        furthest = max(e.epoch for e in attempt(tc.events(), 2) if e.type == "progress")
        progress_after(tc, s3, epoch_above=furthest)  # attempt 3 makes new progress
        assert ctl(tc.run_dir, "auto_recover", "--off") == {"auto_recover": False}
        os.kill(s3.pid, signal.SIGSTOP)
        tc.wait_event(lambda e: e.type == "stall" and e.ts > s3.ts, 30, "the stall")
        verdict = tc.wait_event(lambda e: e.type == "stall_diagnosis" and e.ts > s3.ts, 30, "the verdict")
        assert verdict.diagnosis == "stopped"
        time.sleep(2.5)
        three = attempt(tc.events(), 3)
        assert not of(three, "restart") and not of(three, "exit"), [e.type for e in three]
        assert of(three, "state")[-1].state == "STALLED"
        assert psutil.Process(s3.pid).status() == psutil.STATUS_STOPPED
        assert ctl(tc.run_dir, "auto_recover", "--on") == {"auto_recover": True}
        s4 = start(tc, 4)
        progress_after(tc, s4)
        ctl(tc.run_dir, "stop")
        res = tc.wait(30)

    assert res.returncode == 130, res.describe()
    restarts = of(res.events, "restart")
    assert [(r.attempt, r.preset, r.delay_s) for r in restarts] == [
        (2, "B", 0.0),
        (3, "A", 0.0),
        (4, "B", 0.0),  # the first automatic restart of the incident: no back-off
    ]
    assert [r.reason for r in restarts[:2]] == ["restart requested by the user"] * 2
    assert "stalled; falling back from A to B" in restarts[2].reason
    assert all(r.resume_from == str(ckpt) for r in restarts)
    infos = [e.text for e in of(res.events, "info") if e.key == "auto_recover"]
    assert infos == ["auto-recovery off", "auto-recovery on"]
    assert of(res.events, "state")[-1].state == "STOPPED"
