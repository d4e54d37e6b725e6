"""Mid-epoch checkpoints of the Ultralytics runner, for real (YOLOv8n from YAML, CPU, imgsz 64).

One scenario under preset B (workers = 0): a run with periodic saves gets a planned save
request inside epoch 2 and goes on to the end (the uninterrupted reference); a second run
resumes from that save.  Each run writes a line per batch (TRAINCTL_TRACE_BATCHES).
And a real DataLoader worker deadlock under preset A answers a rescue request.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.test_runner_ultralytics import PRESET_A, PRESET_B, runner, spawn_workers
from tests.helpers.hangs import wait_until
from trainctl.config.demo import make_dataset
from trainctl.core import events as E
from trainctl.store.checkpoint import GOOD_NAME, MID_PREFIX, inspect_checkpoint
from trainctl.store.paths import cache_dir

pytest.importorskip("ultralytics")
pytestmark = pytest.mark.e2e

N_TRAIN, BATCH = 32, 4  # 8 batches an epoch
EPOCHS = 3  # warm-up: 2 epochs (12 batches); nbs = 8: up to 2 batches a step


def write_job(root: Path, n_train: int, every: str) -> Path:
    data = make_dataset(cache_dir() / f"midepoch-e2e-{n_train}", n_train=n_train, n_val=4, size=64)
    job = root / "trainctl.toml"
    job.write_text(f"""\
kind = "ultralytics"
name = "midepoch-test"
checkpoint_every = "{every}"

[ultralytics]
model = "yolov8n.yaml"
data = "{data}"
epochs = {EPOCHS}
imgsz = 64
batch = {BATCH}
nbs = 8
device = "cpu"
project = "{root / "runs"}"
""")
    return job


def request(run_dir: Path, pid: int, rid: int, kind: str) -> None:
    """What the agent does: the request file (atomically), then SIGUSR1 to the main pid."""
    tmp = run_dir / ".save-request.json.tmp"
    tmp.write_text(json.dumps({"id": rid, "kind": kind, "ts": time.time()}))
    os.replace(tmp, run_dir / "save-request.json")
    os.kill(pid, signal.SIGUSR1)


def trace(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.timeout(300)  # bounds for a loaded box: two real YOLO runs
def test_planned_save_inside_an_epoch_then_resume_sees_the_rest_of_that_epoch(tmp_path, monkeypatch):
    # Due at every optimizer step, whatever the machine's speed: on a fast one 0.3 s went by
    # inside no epoch (the clock starts again at each end-of-epoch save) and no periodic save came.
    job = write_job(tmp_path, N_TRAIN, "0.001s")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    kept = tmp_path / "planned.pt"
    asked: list[float] = []

    def on_event(event: E.Event, pid: int) -> None:
        if isinstance(event, E.Progress) and event.epoch == 2 and event.batch >= 1 and not asked:
            asked.append(time.time())
            request(run_dir, pid, 7, "planned")
        if isinstance(event, E.Checkpoint) and event.kind == "planned":
            shutil.copyfile(event.path, kept)  # before later saves prune it

    monkeypatch.setenv("TRAINCTL_TRACE_BATCHES", str(tmp_path / "trace1.jsonl"))
    with runner(job, PRESET_B, run_dir, on_event=on_event) as run:
        assert run.wait(140) == 0
    one = run
    assert [i.text for i in one.of(E.Info) if i.key == "runner.save_on_request"] == ["save on request"]
    mids = [c for c in one.of(E.Checkpoint) if c.kind != "epoch"]
    assert {c.kind for c in mids} >= {"periodic", "planned"}, mids
    assert all(c.ok and c.batch and Path(c.path).name.startswith(MID_PREFIX) for c in mids), mids
    [planned] = [c for c in mids if c.kind == "planned"]
    assert planned.epoch == 2 and planned.detail.startswith("request 7: planned save at batch"), planned
    # save, checkpoint, train: in that order on the channel
    at = one.events.index(planned)
    assert [e.phase for e in one.events[at - 1 : at + 2 : 2]] == ["save", "train"]
    # Pruned: the last two mid-epoch saves and the last end-of-epoch copy.
    left = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert GOOD_NAME in left and len([n for n in left if n.startswith(MID_PREFIX)]) == 2, left
    check = inspect_checkpoint(kept, load=True)
    assert (
        check.ok
        and check.mid_epoch
        and (check.epoch, check.batch, check.kind) == (1, planned.batch, "planned")
    )
    assert check.samples == planned.batch * BATCH
    pauses = next(i.text for i in one.of(E.Info) if i.key == "runner.save_pauses")
    print(pauses)

    monkeypatch.setenv("TRAINCTL_TRACE_BATCHES", str(tmp_path / "trace2.jsonl"))
    with runner(job, PRESET_B, run_dir, "--resume", str(kept)) as run:
        assert run.wait(140) == 0
    two = run
    resume = next(i.text for i in two.of(E.Info) if i.key == "runner.resume")
    assert f"at epoch 2 of {EPOCHS}, batch {planned.batch}" in resume, resume
    progress = two.of(E.Progress)
    assert progress[0].epoch == 2 and progress[0].batch > planned.batch  # the true batch
    assert [c.epoch for c in two.of(E.Checkpoint) if c.kind == "epoch"] == [2, 3]

    ref, res = trace(tmp_path / "trace1.jsonl"), trace(tmp_path / "trace2.jsonl")
    done = [b for b in ref if b["epoch"] == 2 and b["batch"] <= planned.batch]
    after = [b for b in ref if (b["epoch"], b["batch"]) > (2, planned.batch)]
    # The same images in epoch 2: those before the save plus the resumed run's = each once.
    epoch2 = [f for b in done + [b for b in res if b["epoch"] == 2] for f in b["files"]]
    assert sorted(epoch2) == sorted(f for b in ref if b["epoch"] == 2 for f in b["files"])
    assert len(set(epoch2)) == len(epoch2) == N_TRAIN
    # Batch by batch the same as the uninterrupted run: images, optimizer steps, warm-up
    # (accumulate, learning rates); losses differ only by the model restored from the fp16 EMA.
    assert [(b["epoch"], b["batch"], b["files"], b["step"], b["accumulate"]) for b in res] == [
        (b["epoch"], b["batch"], b["files"], b["step"], b["accumulate"]) for b in after
    ]
    for a, b in zip(after, res):
        assert b["lr"] == pytest.approx(a["lr"], rel=1e-9)
    diffs = [abs(b["loss"] - a["loss"]) / max(abs(a["loss"]), 1e-9) for a, b in zip(after, res)]
    print(f"loss, resumed vs uninterrupted, relative: first batch {diffs[0]:.4f}, max {max(diffs):.4f}")
    assert sum(b["step"] for b in res) == sum(b["step"] for b in after) > 0


@pytest.mark.timeout(240)
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="Ultralytics caps workers at the CPU count")
def test_a_worker_deadlock_still_answers_a_rescue_request(tmp_path):
    job = write_job(tmp_path, 40, "0")  # 10 batches: more than 2 workers x prefetch 4 hold
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with runner(job, PRESET_A, run_dir) as run:
        wait_until(lambda: any(p.batch >= 2 for p in run.of(E.Progress)), 180, what="batch 2")
        workers = spawn_workers(run.proc.pid)
        assert len(workers) == 2
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)  # the workers hang: the trainer waits in _try_get_data
        trainer = psutil.Process(run.proc.pid)

        def starved() -> bool:  # the prefetched batches are used up: the main process idles
            t0 = sum(trainer.cpu_times()[:2])
            time.sleep(1.0)
            return sum(trainer.cpu_times()[:2]) - t0 < 0.1

        wait_until(starved, 45, what="the trainer starved")
        before = len(run.of(E.Progress))
        asked = time.time()
        request(run_dir, run.proc.pid, 3, "rescue")
        wait_until(lambda: run.of(E.Checkpoint), 20, what="the rescue save")
        took = time.time() - asked
        [saved] = run.of(E.Checkpoint)
        assert len(run.of(E.Progress)) == before  # taken while blocked, not at a batch end
        assert run.proc.poll() is None
    assert saved.ok and saved.kind == "rescue" and saved.epoch == 1, saved
    assert saved.detail.startswith("request 3: rescue save at batch"), saved
    check = inspect_checkpoint(saved.path, load=True)
    assert check.ok and check.mid_epoch and check.kind == "rescue", check
    print(f"rescue save while blocked: {took:.2f} s after the signal ({saved.detail})")


@pytest.mark.timeout(300)
def test_a_planned_switch_from_A_to_B_under_the_agent_loses_no_batch(tmp_path):
    """The agent and the runner together: `fallback` on a healthy run inside epoch 2 asks
    for a planned save, kills, and the next attempt (preset B) goes on from that save:
    no batch of attempt 1 lies beyond it, and attempt 2 starts right after it."""
    import subprocess
    import sys

    from tests.e2e.conftest import start_trainctl

    job = write_job(tmp_path, 200, "0")  # 50 batches an epoch; only the planned save
    with start_trainctl(
        [
            "run",
            str(job),
            "--json",
            "--preset",
            str(PRESET_A),
            "--fallback",
            str(PRESET_B),
            "--stall-timeout",
            "60",
        ]
    ) as tc:
        tc.wait_event(
            lambda e: e.type == "progress" and e.epoch == 2 and (e.batch or 0) >= 2, 240, "epoch 2 batch 2"
        )
        reply = subprocess.run(
            [sys.executable, "-m", "trainctl", "ctl", str(tc.run_dir), "fallback"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert reply.returncode == 0, reply.stderr
        r = tc.wait(120)
    assert r.returncode == 0, r.describe()
    restart = r.of_type("restart")[0]
    asked = [e for e in r.of_type("info") if e.key == "save_request"][0]
    saved = [c for c in r.of_type("checkpoint") if c.ok and c.ts > asked.ts][0]
    assert restart.preset == "B" and restart.resume_from == saved.path, (restart, saved)
    at = (saved.epoch, saved.batch) if saved.batch is not None else (saved.epoch + 1, 0)
    second = [e.seq for e in r.events if e.type == "start" and e.attempt == 2][0]
    before = [(e.epoch, e.batch) for e in r.of_type("progress") if e.seq < second]
    after = [(e.epoch, e.batch) for e in r.of_type("progress") if e.seq > second]
    assert max(before) <= at, (max(before), at, saved)  # nothing done after the save
    assert after[0] == (at[0], at[1] + 1), (after[0], at)  # and nothing redone
    assert saved.kind == "planned" and saved.batch, saved  # inside the epoch
