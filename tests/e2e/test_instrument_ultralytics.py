"""Zero code change: a plain Ultralytics script (``workers=2`` written in it) run as
``trainctl run --preset A --fallback B -- python script.py`` gets the runner's supervision
through the bootstrap: under A its 2 spawned DataLoader workers are stopped (SIGSTOP)
in epoch 2, trainctl catches the stall, the script saves on request, and the restart runs
under B with 0 workers, resumed from that checkpoint.  A plain PyTorch script run the same
way is left as it is: the same output, byte for byte, and no trainctl module in it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import ROOT, run_trainctl, start_trainctl
from tests.e2e.test_recovery_ultralytics import of, spawn_workers
from tests.helpers.hangs import SCRIPTS, wait_until
from trainctl.config.demo import make_dataset
from trainctl.store.checkpoint import GOOD_NAME
from trainctl.store.paths import cache_dir

pytestmark = pytest.mark.e2e
EPOCHS = 2


def stop_workers_in_epoch_2(run_dir: Path, pid: int) -> list[psutil.Process]:
    """SIGSTOP the trainer's spawned DataLoader workers once epoch 2 has begun (read on the
    side channel, which is not throttled like the journal): the trainer then starves inside
    the epoch once the few batches they prefetched are used."""
    side = run_dir / "side-1.jsonl"

    def in_epoch_2() -> bool:
        try:
            lines = side.read_text().splitlines()
        except OSError:
            return False
        return any('"type":"progress"' in line and '"epoch":2,' in line for line in lines)

    wait_until(in_epoch_2, 150, 0.02, "epoch 2 on the side channel")
    workers = spawn_workers(pid)
    for w in workers:
        w.send_signal(signal.SIGSTOP)
    return workers


@pytest.mark.timeout(420)
def test_a_plain_yolo_script_deadlocks_under_A_and_resumes_under_B_with_no_workers(tmp_path):
    pytest.importorskip("ultralytics")
    data = make_dataset(cache_dir() / "instrument-e2e", n_train=80, n_val=4)  # 20 batches an epoch
    script = SCRIPTS / "plain_yolo.py"
    # No project in the script, started from inside trainctl's checkout (cwd ROOT), whose venv
    # Ultralytics takes its runs_dir from: the results go to the run directory (issue 28).
    tc = start_trainctl(
        [
            "run",
            "--json",
            "--preset",
            "A",
            "--fallback",
            "B",
            "--stall-timeout",
            "10",
            "--run-dir",
            str(tmp_path / "run"),
            "--",
            sys.executable,
            str(script),
            str(data),
            str(EPOCHS),
            "-",
        ],
        cwd=ROOT,
    )
    try:
        pid = tc.wait_event("start", 30).pid
        workers = stop_workers_in_epoch_2(tmp_path / "run", pid)
        stopped_at = time.time()
        res = tc.wait(240)
    finally:
        tc.kill()
    assert res.returncode == 0, res.describe()
    assert len(workers) == 2, "preset A should give the script 2 spawned DataLoader workers"
    events = res.events
    starts = of(events, "start")
    assert [s.preset for s in starts] == ["A", "B"], starts
    # The command is the user's, unchanged; the integration said it attached, each attempt.
    assert starts[0].command == starts[1].command and "--resume" not in starts[1].command
    attached = [e for e in of(events, "info") if e.key == "instrument.attached.ultralytics"]
    assert len(attached) == 2 and attached[0].text.startswith("integration attached: ultralytics 8."), (
        attached
    )
    stall = next(e for e in of(events, "stall") if e.ts > stopped_at)
    verdict = next(e for e in of(events, "stall_diagnosis") if e.ts > stopped_at)
    assert verdict.diagnosis == "stopped" and stall.phase == "train", (stall, verdict)
    rescue = [c for c in of(events, "checkpoint") if c.kind == "rescue" and c.ok and c.ts > stall.ts]
    assert rescue and rescue[0].epoch == 2 and rescue[0].batch, of(events, "checkpoint")
    restart = of(events, "restart")[0]
    assert (restart.attempt, restart.preset, restart.resume_from) == (2, "B", rescue[0].path)
    two = [e for e in events if e.ts >= starts[1].ts]
    infos = {e.key: e.text for e in of(two, "info")}
    assert infos["runner.resume"].startswith(f"resuming from {rescue[0].path}"), infos
    assert infos["runner.preset"].startswith("preset B: 0 DataLoader workers"), infos
    # Every change each preset made to the script's call is said once, beside the script's
    # value or, for a key it did not pass, Ultralytics' own.
    one = [e for e in events if e.ts < starts[1].ts]
    [a_said] = [w.text for w in of(one, "warning") if w.id == "trainctl.preset_overrides"]
    assert a_said.startswith("preset A changes Ultralytics' DataLoaders: prefetch_factor 4 -> 2, "), a_said
    assert "-> 'spawn'" in a_said and "val" not in a_said, a_said  # A keeps validation
    assert a_said.endswith("; and sets OMP_NUM_THREADS=2, torch threads 2"), a_said
    [b_said] = [w.text for w in of(two, "warning") if w.id == "trainctl.preset_overrides"]
    assert b_said == (
        "preset B changes the script's model.train(): workers 2 -> 0; and sets OMP_NUM_THREADS=2"
    ), b_said
    progress = of(two, "progress")
    assert (progress[0].epoch, progress[0].batch) == (2, rescue[0].batch + 1), progress[0]  # nothing redone
    assert (progress[-1].epoch, progress[-1].batch) == (EPOCHS, 20)
    assert of(events, "state")[-1].state == "FINISHED"
    assert [c.epoch for c in of(events, "checkpoint") if c.ok and c.kind == "epoch"][-1] == EPOCHS
    assert (res.run_dir / "checkpoints" / GOOD_NAME).is_file()
    assert "script: training returned" in (res.run_dir / "train.log").read_text()
    # Where the results went (Ultralytics' save_dir): said each attempt, the same place, never
    # inside trainctl's checkout; `status` shows it.
    save_dir = str(res.run_dir.resolve() / "runs" / "detect" / "plain")
    assert [e.text for e in of(events, "info") if e.key == "runner.results_dir"] == [
        f"results in {save_dir}"
    ] * 2
    assert (Path(save_dir) / "weights" / "last.pt").is_file()
    assert not Path(save_dir).resolve().is_relative_to(ROOT)
    status = run_trainctl(["status", "--json", str(res.run_dir)], 30)
    assert json.loads(status.stdout)["save_dir"] == save_dir, status.describe()
    assert f"results {save_dir}" in run_trainctl(["status", str(res.run_dir)], 30).stdout


@pytest.mark.timeout(120)
def test_a_plain_pytorch_script_is_left_untouched(tmp_path):
    """Same output with and without trainctl (its own PYTHONPATH kept), no trainctl module
    imported in it; the dashboard's line says no integration attached."""
    script = SCRIPTS / "plain_torch.py"
    user_path = str(tmp_path / "user-lib")
    env = {**os.environ, "PYTHONPATH": user_path, "PYTHONUNBUFFERED": "1"}
    direct = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, timeout=60)
    assert direct.returncode == 0, direct.stderr
    assert b"trainctl modules: []" in direct.stdout and user_path.encode() in direct.stdout
    res = run_trainctl(["run", "--json", "--preset", "A", "--", sys.executable, str(script)], 90, env=env)
    assert res.returncode == 0, res.describe()
    assert (res.run_dir / "train.log").read_bytes() == direct.stdout + direct.stderr
    infos = [e.key for e in res.of_type("info")]
    assert "instrument.none" in infos and not any(k.startswith("instrument.attached") for k in infos), infos


@pytest.mark.timeout(60)
def test_no_instrument_says_so_and_leaves_python_path_alone():
    from tests.helpers.hangs import STEADY

    res = run_trainctl(
        [
            "run",
            "--json",
            "--no-instrument",
            "--",
            sys.executable,
            str(STEADY),
            "--epochs",
            "1",
            "--batches",
            "3",
        ],
        45,
    )
    assert res.returncode == 0, res.describe()
    infos = {e.key: e.text for e in res.of_type("info")}
    assert infos["instrument.off"] == "no integration: off (--no-instrument); console parsing", infos
    assert "instrument.none" not in infos and not (res.run_dir / "instrument").exists()
