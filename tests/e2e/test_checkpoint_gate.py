"""The checkpoint gate on a real Ultralytics run (YOLOv8n from YAML, CPU, imgsz 32).

A short run with mid-epoch saves writes the corpus: last.pt, best.pt, last_good.pt and
mid-*.pt, none refused.  Then `--resume-from` a hostile file is refused with exit 2, the
global named, its command never run; the user's own file with a class of its own is
refused until `--trust-checkpoint` names it, and then the run resumes from it.
"""

from __future__ import annotations

import argparse
import os

import pytest

from tests.e2e.conftest import run_trainctl
from trainctl.config.demo import make_dataset
from trainctl.store.checkpoint import MID_PREFIX, mid_epoch_checkpoints
from trainctl.store.checkpoint_gate import checkpoint_refusal, load_checkpoint
from trainctl.store.paths import cache_dir

torch = pytest.importorskip("torch")
pytest.importorskip("ultralytics")
pytestmark = pytest.mark.e2e


class RunsCommand:
    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


@pytest.mark.timeout(240)
def test_real_checkpoints_pass_hostile_ones_are_refused_and_trust_lets_the_users_own_through(tmp_path):
    data = make_dataset(cache_dir() / "gate-e2e-8", n_train=8, n_val=2, size=32)
    job = tmp_path / "trainctl.toml"
    job.write_text(f"""\
kind = "ultralytics"
name = "gate-test"
checkpoint_every = "0.01s"

[ultralytics]
model = "yolov8n.yaml"
data = "{data}"
epochs = 1
imgsz = 32
batch = 2
nbs = 2
device = "cpu"
project = "{tmp_path / "runs"}"
plots = false
""")
    first = run_trainctl(["run", str(job), "--json"], timeout=200)
    assert first.returncode == 0, first.describe()
    checkpoints = first.of_type("checkpoint")
    assert checkpoints and all(c.ok and "resumable" in c.detail for c in checkpoints), checkpoints
    mids = [c for c in checkpoints if os.path.basename(c.path).startswith(MID_PREFIX)]
    assert mids, checkpoints
    corpus = [*(tmp_path / "runs").rglob("*.pt"), *(first.run_dir / "checkpoints").glob("*.pt")]
    assert {p.name for p in corpus} >= {"last.pt", "best.pt", "last_good.pt"}, corpus
    kept = mid_epoch_checkpoints(first.run_dir / "checkpoints")  # the newest mid-epoch saves
    assert kept, corpus
    assert {p: checkpoint_refusal(p) for p in corpus} == dict.fromkeys(corpus), corpus

    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt"
    real = load_checkpoint(first.run_dir / "checkpoints" / "last_good.pt")
    torch.save({**real, "epoch": 0, "optimizer": RunsCommand(f"touch {marker}")}, evil)
    bad = run_trainctl(["run", str(job), "--json", "--resume-from", str(evil)], timeout=60)
    assert bad.returncode == 2 and "imports posix.system" in bad.stderr, bad.describe()
    assert not marker.exists()

    mid = load_checkpoint(kept[-1])  # a save inside an epoch: there is something to resume
    own = tmp_path / "own.pt"
    torch.save({**mid, "notes": argparse.Namespace(by="me")}, own)
    refused = run_trainctl(["run", str(job), "--json", "--resume-from", str(own)], timeout=60)
    assert refused.returncode == 2, refused.describe()
    assert "imports argparse.Namespace" in refused.stderr and "--trust-checkpoint" in refused.stderr
    trusted = run_trainctl(
        ["run", str(job), "--json", "--resume-from", str(own), "--trust-checkpoint", str(own)], timeout=200
    )
    assert trusted.returncode == 0, trusted.describe()
    (start,) = trusted.of_type("start")
    assert list(start.command[-4:]) == ["--resume", str(own), "--trust-checkpoint", str(own)], start.command
    assert any(i.key == "runner.resume" and str(own) in i.text for i in trusted.of_type("info"))
