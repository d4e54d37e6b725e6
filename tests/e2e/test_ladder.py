"""The ladder under a real `trainctl run`: examples/ladder_faults.py (a real PyTorch loop with
real DataLoader workers) hangs with 4 workers in its first attempt; the ladder steps down to
2 workers, steps back up after a stable stretch (a planned restart that saves first), and the
run finishes there; the rung is remembered for the next run."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.e2e.conftest import PYTHON, ROOT, run_trainctl
from tests.e2e.test_recovery import of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

INJECTOR = ROOT / "examples" / "ladder_faults.py"


def ladder_job(tmp_path: Path) -> Path:
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "A.toml").write_text("[dataloader]\nworkers = 4\n")
    command = [
        PYTHON,
        "-u",
        str(INJECTOR),
        "--rates",
        "4:0.02,2:0",  # with 4 workers, seed 6: attempt 1 hangs at its batch 123
        "--seed",
        "6",
        "--hang-attempts",
        "1",
        "--batch-times",
        "4:0.02,2:0.08",
        "--epochs",
        "3",
        "--batches",
        "250",
        "--save-every",
        "25",
        "--checkpoint-dir",
        str(tmp_path / "ckpts"),
    ]
    job = tmp_path / "trainctl.toml"
    job.write_text(
        'name = "ladder-e2e"\nkind = "command"\n'
        f"command = {json.dumps(command)}\n"
        'resume_args = ["--resume", "{checkpoint}"]\n'
        'preset = "A"\nmax_restarts = 4\n'
        '[stall]\ntrain_timeout = 3\n[ladder]\nworkers = [4, 2]\nstable = "6s"\n'
    )
    return job


def test_the_ladder_steps_down_on_a_hang_up_after_a_stable_stretch_and_settles(tmp_path):
    res = run_trainctl(["run", "--json", str(ladder_job(tmp_path))], timeout=140)
    assert res.returncode == 0, res.describe()
    moves = of(res.events, "ladder")
    assert [(m.direction, m.to_preset) for m in moves] == [("down", "A.w2"), ("up", "A.w4")], moves
    down, up = moves
    assert "deadlock on A.w4" in down.reason or "stall" in down.reason, down.reason
    assert up.numbers["saved_s"] > up.numbers["extra_cost_s"] and up.numbers["stable_s"] >= 6.0
    starts = [s.preset for s in of(res.events, "start")]
    assert starts == ["A.w4", "A.w2", "A.w4"], starts
    restarts = of(res.events, "restart")
    assert "ladder: one rung down to A.w2" in restarts[0].reason
    assert restarts[1].reason.startswith("ladder: one rung up to A.w4")
    planned = [c for c in of(res.events, "checkpoint") if c.kind == "planned"]
    assert planned and planned[0].ok  # the step up saved first
    log = (res.run_dir / "train.log").read_text()
    workers = re.findall(r"ladder_faults workers=(\d+)", log)
    assert workers == ["4", "2", "4"], workers
    remembered = json.loads((Path(os.environ["TRAINCTL_DATA_DIR"]) / "ladder.json").read_text())
    assert next(iter(remembered.values()))["rung"] == "A.w4"
