"""Checkpoint checks against real torch checkpoints in Ultralytics' format.

The files are written the way ``BaseTrainer.save_model`` writes them: ``torch.save`` of
the same dict, with a real YOLOv8n ``DetectionModel`` (fp16 EMA) and real optimizer
state.  Damage is real too: truncation (a kill during Ultralytics' in-place write),
a flipped byte, an empty file.
"""

from __future__ import annotations

import os
import shutil
from copy import deepcopy
from pathlib import Path

import pytest

from trainctl.store.checkpoint import (
    GOOD_NAME,
    TRAINCTL_KEY,
    copy_and_verify,
    inspect_checkpoint,
    keep_good_copy,
    pick_resume_checkpoint,
    scan_pickle,
    verify_checkpoint,
)

torch = pytest.importorskip("torch")
pytest.importorskip("ultralytics")


@pytest.fixture(scope="module")
def model_and_optimizer():
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolov8n.yaml", nc=2, verbose=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-3)
    optimizer.step()  # momentum buffers: real optimizer state
    return model, optimizer


@pytest.fixture
def save(tmp_path, model_and_optimizer):
    model, optimizer = model_and_optimizer

    def write(
        name: str, epoch: int, epochs: int = 3, optimizer_state: bool = True, mid: dict | None = None
    ) -> Path:
        path = tmp_path / name
        extra = (
            {
                TRAINCTL_KEY: {
                    "format": 1,
                    "epoch": epoch,
                    **mid,
                    "sampler_state": torch.get_rng_state(),
                    "tloss": {"box_loss": 1.5},
                }
            }
            if mid
            else {}
        )
        torch.save(
            {
                "epoch": epoch,
                "best_fitness": None,
                "model": None,
                "ema": deepcopy(model).half(),
                "updates": 10,
                "optimizer": optimizer.state_dict() if optimizer_state else None,
                "train_args": {"epochs": epochs, "optimizer": "auto", "batch": 4},
                "train_metrics": {},
                "version": "8.4.190",
                **extra,
            },
            path,
        )
        return path

    return write


def truncate(path: Path, dest: Path) -> Path:
    data = path.read_bytes()
    dest.write_bytes(data[: len(data) * 2 // 3])
    return dest


@pytest.mark.parametrize("load", [False, True])
def test_a_resumable_checkpoint_passes(save, load):
    check = inspect_checkpoint(save("last.pt", epoch=1), load=load)
    assert check.ok, check.detail
    assert (check.epoch, check.epochs, check.complete) == (1, 3, False)
    assert "epoch 2/3, resumable" in check.detail


@pytest.mark.parametrize("load", [False, True])
def test_truncated_last_fails_and_the_previous_good_copy_is_picked(save, tmp_path, load):
    keep = tmp_path / "checkpoints"
    good = keep_good_copy(save("epoch1.pt", epoch=1), keep)
    assert good == keep / GOOD_NAME
    kept_bytes = good.read_bytes()

    last = truncate(save("epoch2.pt", epoch=2, epochs=4), tmp_path / "last.pt")  # newer, but cut short
    ok, detail = verify_checkpoint(last, load=load)
    assert not ok and "truncated" in detail

    assert keep_good_copy(last, keep) is None  # a bad last.pt never replaces the good copy
    assert good.read_bytes() == kept_bytes
    assert [p.name for p in keep.iterdir()] == [GOOD_NAME]  # no temp file left behind

    skipped = []
    chosen = pick_resume_checkpoint([last, good], load=load, on_skip=lambda p, why: skipped.append((p, why)))
    assert chosen == good
    assert len(skipped) == 1 and skipped[0][0] == last and "truncated" in skipped[0][1]


def test_copy_and_verify_reports_why(save, tmp_path):
    last = truncate(save("full.pt", epoch=1), tmp_path / "last.pt")
    check = copy_and_verify(last, tmp_path / "keep")
    assert not check.ok and check.path == last and "truncated" in check.detail
    assert not (tmp_path / "keep" / GOOD_NAME).exists()


def test_flipped_byte_and_empty_file_fail(save, tmp_path):
    path = save("last.pt", epoch=1)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    flipped = tmp_path / "flipped.pt"
    flipped.write_bytes(bytes(data))
    ok, detail = verify_checkpoint(flipped)
    assert not ok, detail
    empty = tmp_path / "empty.pt"
    empty.touch()
    assert verify_checkpoint(empty) == (False, "empty file (0 bytes)")
    assert not verify_checkpoint(tmp_path / "missing.pt")[0]


@pytest.mark.parametrize("load", [False, True])
def test_finished_and_complete_runs(save, load):
    finished = inspect_checkpoint(save("final.pt", epoch=-1, optimizer_state=False), load=load)
    assert not finished.ok and finished.complete
    assert "nothing to resume" in finished.detail
    last_epoch = inspect_checkpoint(save("last.pt", epoch=2, epochs=3), load=load)
    assert last_epoch.ok and last_epoch.complete  # whole and resumable, but nothing left to train
    no_optimizer = inspect_checkpoint(save("weights.pt", epoch=1, optimizer_state=False), load=load)
    assert not no_optimizer.ok and "no optimizer state" in no_optimizer.detail


def test_pick_prefers_the_highest_epoch_and_ignores_missing(save, tmp_path):
    older_but_further = save("a.pt", epoch=2, epochs=5)
    newer = save("b.pt", epoch=1, epochs=5)
    os.utime(older_but_further, (1_000_000, 1_000_000))
    assert pick_resume_checkpoint([None, tmp_path / "nope.pt", newer, older_but_further]) == older_but_further
    assert pick_resume_checkpoint([tmp_path / "nope.pt"]) is None


@pytest.mark.parametrize("load", [False, True])
def test_mid_epoch_saves_rank_by_position(save, load):
    """A save inside the last epoch is not a finished run; saves rank by (epoch, samples)."""
    end1 = save("end1.pt", epoch=0)  # epoch 1 done
    mid2 = save("mid2.pt", epoch=1, mid={"batch": 7, "samples": 28, "kind": "periodic"})
    mid2_early = save("mid2e.pt", epoch=1, mid={"batch": 3, "samples": 12, "kind": "rescue"})
    mid3 = save("mid3.pt", epoch=2, mid={"batch": 1, "samples": 4, "kind": "planned"})  # the last epoch
    check = inspect_checkpoint(mid3, load=load)
    assert check.ok and check.mid_epoch and not check.complete, check
    assert (check.epoch, check.batch, check.samples, check.kind) == (2, 1, 4, "planned")
    assert "epoch 3/3 batch 1, resumable mid-epoch" in check.detail
    assert not inspect_checkpoint(end1, load=load).mid_epoch
    for path in (mid2, mid2_early, end1):
        os.utime(path, (2_000_000, 2_000_000))  # older files, but not what decides
    os.utime(mid3, (1_000_000, 1_000_000))
    assert pick_resume_checkpoint([end1, mid2_early, mid2], load=load) == mid2
    assert pick_resume_checkpoint([end1, mid2, mid3], load=load) == mid3
    end2 = save("end2.pt", epoch=1)  # epoch 2 done: past mid2
    assert pick_resume_checkpoint([mid2, end2], load=load) == end2


def test_the_pickle_scan_never_runs_the_pickle(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (shutil.copyfile, (__file__, str(marker)))

    path = tmp_path / "evil.pt"
    torch.save({"epoch": 0, "optimizer": Evil(), "train_args": {"epochs": 2}}, path)
    ok, detail = verify_checkpoint(path)  # the structure is fine, but the gate names the callable
    assert not ok and "imports shutil.copyfile" in detail, detail
    assert not inspect_checkpoint(path, load=True).ok
    assert not marker.exists()
    assert scan_pickle(b"\x80\x02]q\x00.") is None  # a list, not a checkpoint dict
