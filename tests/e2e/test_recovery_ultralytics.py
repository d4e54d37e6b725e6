"""Recovery of a real Ultralytics job: YOLOv8n on a tiny synthetic data set, on CPU.

Under preset A (2 spawned DataLoader workers) the workers are stopped with SIGSTOP in
epoch 2; trainctl detects the stall, kills the tree and resumes under preset B from the
last good checkpoint the runner kept.  The checkpoints of that run (real ones) then
show that the agent never resumes from a truncated file, and its preset history (with
``checkpoint_every = "auto"`` deciding from it) what the hang cost.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import start_trainctl, verdicts
from trainctl.agent import Agent
from trainctl.config.demo import make_dataset
from trainctl.store.checkpoint import GOOD_NAME, inspect_checkpoint
from trainctl.store.journal import read_events
from trainctl.store.paths import cache_dir, make_private_dir
from trainctl.store.preset_history import PresetHistory
from trainctl.store.spec import RunSpec

pytest.importorskip("ultralytics")
pytestmark = pytest.mark.e2e

EPOCHS = 3


def write_job(root: Path) -> Path:
    # 40 images in batches of 4: 10 batches an epoch, more than A's 2 workers x prefetch 2
    # hold ready, so stopped workers starve the trainer within the epoch.
    data = make_dataset(cache_dir() / "recovery-e2e", n_train=40, n_val=4)
    job = root / "trainctl.toml"
    job.write_text(f"""\
kind = "ultralytics"
name = "recovery-test"
preset = "A"
fallback = "B"
checkpoint_every = "auto"

[ultralytics]
model = "yolov8n.yaml"
data = "{data}"
epochs = {EPOCHS}
imgsz = 64
batch = 4
device = "cpu"
""")
    return job


def spawn_workers(pid: int) -> list[psutil.Process]:
    out = []
    try:
        children = psutil.Process(pid).children()
    except psutil.Error:
        return out
    for child in children:
        try:
            if "spawn_main" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                out.append(child)
        except psutil.Error:
            continue
    return out


def stop_workers(tc) -> tuple[list[psutil.Process], float]:
    """SIGSTOP the spawned DataLoader workers of the run's first trainer: (them, when)."""
    workers = spawn_workers(of(tc.events(), "start")[0].pid)
    for w in workers:
        w.send_signal(signal.SIGSTOP)
    return workers, time.time()


def of(events, kind: str) -> list:
    return [e for e in events if e.type == kind]


@pytest.fixture(scope="module")
def recovered(tmp_path_factory):
    """Run the SIGSTOP scenario once; the tests below read what it left."""
    root = tmp_path_factory.mktemp("yolo-recovery")
    with pytest.MonkeyPatch.context() as mp:  # what tests/conftest.py does per test
        mp.setenv("TRAINCTL_CONFIG_DIR", str(root / "config"))
        mp.setenv("TRAINCTL_RUNS_DIR", str(root / "runs"))
        mp.setenv("TRAINCTL_DATA_DIR", str(root / "data"))
        mp.setenv("YOLO_OFFLINE", "1")
        mp.setenv("YOLO_CONFIG_DIR", str(root / "yolo"))
        mp.delenv("GITHUB_ACTIONS", raising=False)
        mp.setenv("TRAINCTL_CACHE_DIR", os.environ.get("TRAINCTL_TEST_CACHE", "/tmp/trainctl-test-cache"))
        return _run_scenario(root)


def _run_scenario(root: Path) -> dict:
    job = write_job(root)
    saved = root / "epoch1_good.pt"
    tc = start_trainctl(["run", str(job), "--json", "--stall-timeout", "6", "--run-dir", str(root / "run")])
    try:
        good = tc.run_dir / "checkpoints" / GOOD_NAME
        tc.wait_event(lambda e: e.type == "checkpoint" and e.epoch == 1 and e.ok, 120, "epoch 1's checkpoint")
        shutil.copyfile(good, saved)  # a real good checkpoint, older than the final one
        start1 = of(tc.events(), "start")[0]
        tc.wait_event(lambda e: e.type == "progress" and e.epoch == 2, 60, "epoch 2")
        workers, stopped_at = stop_workers(tc)
        result = tc.wait(300)  # 3 real epochs, one under B: 150 s was not enough at load 15
    finally:
        tc.kill()
    return {
        "result": result,
        "workers": workers,
        "stopped_at": stopped_at,
        "epoch1": saved,
        "good": good,
        "start1": start1,
        "data_dir": root / "data",
    }


@pytest.mark.timeout(480)  # includes the module's scenario (setup), a loaded box
def test_stopped_workers_under_A_resume_under_B_inside_the_epoch_from_a_rescue_save(recovered):
    """Workers SIGSTOPped: the main thread still runs Python (it waits for data), so the
    agent asks for a rescue save before the kill, and B resumes inside that epoch."""
    res, good = recovered["result"], recovered["good"]
    assert res.returncode == 0, res.describe()
    assert len(recovered["workers"]) == 2, "preset A should have 2 spawned DataLoader workers"
    events = res.events
    stall = next(e for e in of(events, "stall") if e.ts > recovered["stopped_at"])
    verdict = next(e for e in verdicts(events) if e.ts >= stall.ts)  # said at detection, judged after
    assert verdict.diagnosis == "stopped" and stall.phase == "train", (stall, verdict)
    rescue = [c for c in of(events, "checkpoint") if c.kind == "rescue" and c.ok and c.ts > stall.ts]
    assert rescue and rescue[0].epoch == 2 and rescue[0].batch, of(events, "checkpoint")
    restart = of(events, "restart")[0]
    assert restart.ts > rescue[0].ts
    assert (restart.attempt, restart.preset, restart.resume_from) == (2, "B", rescue[0].path)
    starts = of(events, "start")
    assert starts[1].attempt == 2 and starts[1].preset == "B" and starts[1].ts > restart.ts
    assert "--resume" in starts[1].command and rescue[0].path in starts[1].command
    # Attempt 1's processes (the stopped workers included) are gone.
    assert not [w.pid for w in recovered["workers"] if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    assert (
        not psutil.pid_exists(starts[0].pid) or psutil.Process(starts[0].pid).status() == psutil.STATUS_ZOMBIE
    )
    # Attempt 2 resumed inside epoch 2, where the rescue save was, with no workers, and finished.
    two = [e for e in events if e.ts >= starts[1].ts]
    infos = {e.key: e.text for e in of(two, "info")}
    assert "resuming from" in infos["runner.resume"], infos
    assert infos["runner.preset"].startswith("preset B: 0 DataLoader workers")
    progress = of(two, "progress")
    assert progress[0].epoch == 2 and progress[0].batch > 1, progress[0]
    assert progress[-1].epoch == EPOCHS
    assert of(events, "exit")[-1].returncode == 0
    assert of(events, "state")[-1].state == "FINISHED"
    assert [c.epoch for c in of(events, "checkpoint") if c.ok and c.kind == "epoch"][-1] == EPOCHS
    assert inspect_checkpoint(good).epoch == EPOCHS - 1


@pytest.mark.timeout(480)  # the module's scenario runs first when this test runs alone
def test_the_preset_history_keeps_the_hang_and_presets_stats_shows_it(recovered):
    """The run's hours on A, its hang with the measured cost, and B's clean hours are in the
    preset history; the projection gave A's what-if that risk; checkpoint_every "auto" decided
    from the measured save pause; `presets stats` says it."""
    data_dir, events = recovered["data_dir"], recovered["result"].events
    records, problems = PresetHistory(data_dir / "preset-history").read("recovery-test")
    assert problems == []
    by = {r.key.preset: r for r in records}
    a, b = by["A"], by["B"]
    starts, restart = of(events, "start"), of(events, "restart")[0]
    last_a = [e for e in of(events, "progress") if e.ts < restart.ts][-1]
    assert a.incidents == {"hang": 1}  # diagnosis "stopped": a hang of no named kind
    # to its last batch, which the stall's idle_s dates (the journal's progress is throttled)
    ran = last_a.ts - starts[0].ts
    assert ran - 15.0 <= a.hours * 3600 <= restart.ts - starts[0].ts, (a.hours * 3600, ran)
    assert a.batches >= 10 and b.batches >= 10 and b.hours > 0  # (B may stall on a loaded box)
    assert a.costed == 1, a  # B got back past the batch A stopped at
    assert {"detection", "restart", "startup", "redone"} <= set(a.cost_s)
    # every worker stopped is certain after 3 s (the stall timeout, 6 s, comes later); from
    # the last batch at least the second the trainer takes to be seen blocked
    assert a.cost_s["detection"] >= 1.0
    assert a.key.machine.startswith(socket.gethostname()) and a.key.content != b.key.content
    risky = [w for p in of(events, "projection") for w in p.what_if if w["preset"] == "A" and w.get("risk")]
    assert risky and risky[-1]["risk"]["incidents"] == 1 and risky[-1]["risk"]["cost_measured"], risky[-1:]
    # checkpoint_every = "auto": decided once epoch 1's save pause was measured, again after the hang
    auto = [e for e in of(events, "info") if e.key == "checkpoint.auto"]
    first_save = next(c for c in of(events, "checkpoint") if c.ok)
    assert auto and auto[0].ts >= first_save.ts and "s save × " in auto[0].text, auto
    every = json.loads((recovered["result"].run_dir / "checkpoint-every.json").read_text())["every_s"]
    assert 30.0 <= every <= 1800.0 and f"{every:.0f} s" in auto[-1].text
    env = {**os.environ, "TRAINCTL_DATA_DIR": str(data_dir)}
    out = subprocess.run(
        [sys.executable, "-m", "trainctl", "presets", "stats", "recovery-test"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    line_a = next(line for line in out.splitlines() if line.startswith("A "))
    assert "1 (1 hang)" in line_a and "≈ " in line_a, out
    assert any(line.startswith("B ") for line in out.splitlines()), out


def make_agent(run_dir: Path) -> Agent:
    make_private_dir(run_dir)
    spec = RunSpec(
        job_name="t",
        kind="ultralytics",
        job_file=str(run_dir / "job.toml"),
        preset="A",
        fallback="B",
        kernel_log=False,
    )
    return Agent(run_dir, spec, serve=False)


@pytest.mark.timeout(480)  # the module's scenario runs first when this test runs alone
def test_a_truncated_checkpoint_is_never_resumed_from(recovered, tmp_path):
    newest, older = recovered["good"], recovered["epoch1"]  # real: epochs 3 and 1
    assert inspect_checkpoint(newest).ok and inspect_checkpoint(older).epoch == 0
    run_dir = tmp_path / "run"
    agent = make_agent(run_dir)
    kept = run_dir / "checkpoints" / GOOD_NAME
    kept.parent.mkdir()
    shutil.copyfile(older, kept)
    last = run_dir / "weights" / "last.pt"
    last.parent.mkdir()

    # A whole newer checkpoint is preferred to the older kept one ...
    shutil.copyfile(newest, last)
    agent.ctx.facts.last_checkpoint = str(last)
    assert agent.loop.resume_checkpoint() == str(last)
    # ... but the same file cut short by a kill mid-write is skipped, with a word why.
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 2])
    os.utime(last)
    assert agent.loop.resume_checkpoint() == str(kept)
    # And when the kept copy is the damaged one, the older good file is used.
    shutil.copyfile(older, last)
    kept.write_bytes(newest.read_bytes()[:4096])
    assert agent.loop.resume_checkpoint() == str(last)
    agent.journal.close()
    skips = [
        e.text for e in read_events(run_dir / "events.jsonl") if e.type == "info" and e.key == "resume_skip"
    ]
    assert len(skips) == 2 and str(last) in skips[0] and str(kept) in skips[1], skips
    assert all("truncated" in s or "zip" in s for s in skips), skips
