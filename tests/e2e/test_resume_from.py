"""`trainctl run --resume-from`: a new run that starts from an earlier run's checkpoint
(after a FAILED run the user fixes things and goes on, not from epoch 1)."""

from __future__ import annotations

import json
import signal

import pytest

from tests.e2e.conftest import PYTHON, ROOT, run_trainctl, start_trainctl, write_ultralytics_job
from trainctl.store.checkpoint import GOOD_NAME

pytestmark = pytest.mark.e2e
TRAIN_LOOP = ROOT / "tests" / "helpers" / "scripts" / "train_loop.py"


@pytest.mark.timeout(60)
def test_a_command_starts_from_the_given_checkpoint(tmp_path):
    ck = tmp_path / "ck.json"
    loop = [
        PYTHON,
        str(TRAIN_LOOP),
        "--batches",
        "10",
        "--batch-time",
        "0.01",
        "--workers",
        "0",
        "--checkpoint",
        str(ck),
    ]
    first = run_trainctl(["run", "--json", "--", *loop, "--epochs", "2"], timeout=40)
    assert first.returncode == 0, first.describe()
    assert json.loads(ck.read_text()) == {"epoch": 2}
    second = run_trainctl(
        [
            "run",
            "--json",
            "--resume-arg=--resume",
            "--resume-arg={checkpoint}",
            "--resume-from",
            str(ck),
            "--",
            *loop,
            "--epochs",
            "3",
        ],
        timeout=40,
    )
    assert second.returncode == 0, second.describe()
    (start,) = second.of_type("start")
    assert list(start.command[-2:]) == ["--resume", str(ck)], start.command
    assert {p.epoch for p in second.of_type("progress")} == {3}
    assert any(i.key == "resume_from" and str(ck) in i.text for i in second.of_type("info"))
    assert "resume_epoch=2" in (second.run_dir / "train.log").read_text()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--resume-from", "/nonexistent/ck.pt", "--resume-arg", "{checkpoint}"],
            "no such file or run directory",
        ),
        (["--resume-from", "{tmp}"], "resumes through its resume arguments"),
        (
            ["--resume-from", "{tmp}", "--resume-arg", "{checkpoint}"],
            "not a checkpoint file nor a trainctl run",
        ),
    ],
)
def test_bad_resume_from_is_refused_naming_the_path(tmp_path, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    r = run_trainctl(["run", "--json", *args, "--", PYTHON, "-c", "pass"], timeout=20)
    assert r.returncode == 2, r.describe()
    assert message in r.stderr and "--resume-from" in r.stderr, r.stderr


@pytest.mark.timeout(180)
def test_an_ultralytics_run_goes_on_from_an_earlier_run_directory(tmp_path):
    job = write_ultralytics_job(tmp_path / "job", n_train=16, n_val=4, epochs=3, batch=4, preset="B")
    with start_trainctl(["run", str(job), "--json"]) as tc:
        tc.wait_event(lambda e: e.type == "checkpoint" and e.epoch == 1 and e.ok, 120, "epoch 1's checkpoint")
        tc.signal(signal.SIGINT)
        first = tc.wait(60)
    assert first.returncode == 130, first.describe()
    assert (first.run_dir / "checkpoints" / GOOD_NAME).exists()
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes((first.run_dir / "checkpoints" / GOOD_NAME).read_bytes()[:5000])
    bad = run_trainctl(["run", str(job), "--json", "--resume-from", str(truncated)], timeout=60)
    assert bad.returncode == 2 and "not a checkpoint that loads" in bad.stderr, bad.describe()

    second = run_trainctl(["run", str(job), "--json", "--resume-from", str(first.run_dir)], timeout=150)
    assert second.returncode == 0, second.describe()
    (start,) = second.of_type("start")
    assert "--resume" in start.command, start.command
    epochs = sorted({p.epoch for p in second.of_type("progress")})
    assert epochs[0] >= 2 and epochs[-1] == 3, epochs  # epoch 1 was not trained again


@pytest.mark.timeout(60)
def test_a_command_goes_on_from_the_newest_checkpoint_of_a_run_that_loads(tmp_path):
    """The earlier run reported two checkpoints; the newer was cut short by a kill: the new
    run starts from the older one and says why; when none loads it is refused (exit 2)."""
    torch = pytest.importorskip("torch")
    from trainctl.core import events as E
    from trainctl.store.spec import RunSpec

    earlier = tmp_path / "earlier"
    earlier.mkdir()
    older, newer = tmp_path / "epoch1.pt", tmp_path / "epoch2.pt"
    torch.save({"epoch": 1, "w": torch.randn(256, 256)}, older)
    newer.write_bytes(older.read_bytes()[: older.stat().st_size // 2])
    RunSpec(job_name="earlier", kind="command", command=["true"], cwd=str(tmp_path)).save(
        earlier / "spec.json"
    )
    (earlier / "events.jsonl").write_text(
        "".join(E.encode(E.Checkpoint(0.0, p.name, i, True)) + "\n" for i, p in enumerate((older, newer)))
    )
    show = [PYTHON, "-c", "import sys; print('argv', sys.argv[1:])"]
    r = run_trainctl(
        [
            "run",
            "--json",
            "--resume-arg=--resume",
            "--resume-arg={checkpoint}",
            "--resume-from",
            str(earlier),
            "--",
            *show,
        ],
        timeout=40,
    )
    assert r.returncode == 0, r.describe()
    (start,) = r.of_type("start")
    assert list(start.command[-2:]) == ["--resume", str(older)], start.command
    assert f"passed over {newer}" in r.stderr and "truncated" in r.stderr, r.stderr

    older.write_bytes(older.read_bytes()[:100])
    r = run_trainctl(
        ["run", "--json", "--resume-arg={checkpoint}", "--resume-from", str(earlier), "--", *show], timeout=20
    )
    assert r.returncode == 2 and "no checkpoint that verifies" in r.stderr, r.describe()
    assert str(older) in r.stderr and str(newer) in r.stderr, r.stderr
