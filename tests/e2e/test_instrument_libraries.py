"""Zero-code integrations for Transformers and Lightning, for real: `trainctl run --preset A
--fallback B -- python script.py` on plain user scripts (tests/helpers/scripts/hf_trainer.py,
lightning_train.py: tiny models built in code, random data, CPU, nothing downloaded) that
write ``num_workers=2`` themselves.

Each test: under A a real DataLoader worker blocks forever at a batch; trainctl catches the
stall, kills, and restarts under B (the script's 2 workers become 0) from the library's own
checkpoint, and the step goes on from there; then a save request (the agent's protocol:
``save-request.json`` + SIGUSR1 to the trainer) lands inside epoch 2 through the library's
own save, and the run finishes.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import PYTHON, start_trainctl, wait_until
from tests.e2e.test_recovery import attempt
from tests.helpers.hangs import SCRIPTS
from trainctl.core import events as E
from trainctl.inside.report import write_save_request
from trainctl.store.checkpoint_verify import verify_path

pytestmark = pytest.mark.e2e

PER_EPOCH = 16  # 64 samples, batch 4
STALL_S = "5"


def needs(*modules: str) -> None:
    """Skip without the test extra's libraries (found, not imported: that takes seconds)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (the test extra has them)")


def presets(root: Path) -> tuple[str, str]:
    """A: 2 forked workers (the scripts' own setting; fork keeps the test fast), B: none."""
    a, b = root / "A.toml", root / "B.toml"
    a.write_text('description = "test A"\n[dataloader]\nworkers = 2\nmultiprocessing_context = "fork"\n')
    b.write_text('description = "test B"\n[dataloader]\nworkers = 0\n')
    return str(a), str(b)


def of(events: list[E.Event], kind: str, key: str | None = None) -> list:
    return [e for e in events if e.type == kind and (key is None or getattr(e, "key", None) == key)]


def side(run_dir: Path, n: int, kind: str) -> list:
    """What attempt ``n``'s trainer itself wrote on its side channel (every progress event;
    the journal keeps one a second)."""
    try:
        lines = (run_dir / f"side-{n}.jsonl").read_bytes().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            ev = E.decode(line)
        except ValueError:  # a line being written
            continue
        if ev.type == kind:
            out.append(ev)
    return out


def run_scenario(tmp_path: Path, script: str, *args: str) -> tuple[list[E.Event], E.Checkpoint, Path]:
    """The run (A hangs, B resumes) with a planned save request inside epoch 2 of attempt 2;
    its journal, the checkpoint that answered the request, its run directory."""
    a, b = presets(tmp_path)
    cmd = [
        "run",
        "--json",
        "--preset",
        a,
        "--fallback",
        b,
        "--stall-timeout",
        STALL_S,
        "--",
        PYTHON,
        str(SCRIPTS / script),
        str(tmp_path / "out"),
        "--load-time",
        "0.03",
        *args,
    ]
    with start_trainctl(cmd) as tc:
        second = tc.wait_event(lambda e: e.type == "start" and e.attempt == 2, 120, "attempt 2")
        # The trainer's own side channel (the journal lags up to a second): epoch 2 began.
        wait_until(
            lambda: any(p.epoch == 2 for p in side(tc.run_dir, 2, "progress")),
            90,
            what="attempt 2 inside epoch 2",
        )
        write_save_request(tc.run_dir, 9, "planned", time.time())  # what the agent does
        os.kill(second.pid, signal.SIGUSR1)
        answer = tc.wait_event(
            lambda e: e.type == "checkpoint" and e.kind == "planned", 30, "the planned save"
        )
        res = tc.wait(60)
    assert res.returncode == 0, res.describe()
    return res.events, answer, res.run_dir


def check_common(events: list[E.Event], integration: str) -> tuple[list[E.Event], list[E.Event]]:
    one, two = attempt(events, 1), attempt(events, 2)
    for part in (one, two):
        keys = [i.key for i in of(part, "info") if i.key.startswith("instrument.")]
        # (torchmetrics, which lightning imports, imports transformers when it is installed)
        assert not [k for k in keys if k in ("instrument.failed", "instrument.refused")], keys
        # the integration whose Trainer trains says so last: the agent resumes by its rule
        assert keys[-1] == f"instrument.attached.{integration}", keys
        assert of(part, "info", "runner.save_on_request")
    [stall] = of(one, "stall")
    [verdict] = of(one, "stall_diagnosis")
    assert stall.phase == "train" and verdict.diagnosis == "deadlock", (stall, verdict)
    [restart] = of(one, "restart")
    assert restart.preset == "B" and restart.resume_from, restart
    # B's workers = 0 replaced the script's num_workers=2, and said so.
    [overrides] = [w for w in of(two, "warning") if w.id == "trainctl.preset_overrides"]
    assert "num_workers 2 -> 0" in overrides.text, overrides
    assert of(events, "state")[-1].state == "FINISHED"
    return one, two


def check_planned(answer: E.Checkpoint) -> None:
    assert answer.ok and answer.detail.startswith("request 9:"), answer
    assert answer.epoch == 2 and 0 < answer.batch < PER_EPOCH, answer  # inside the epoch
    assert verify_path(answer.path).ok, verify_path(answer.path)


@pytest.mark.timeout(240)
def test_transformers_trainer_script_hang_resume_and_save_request(tmp_path):
    needs("transformers", "accelerate")
    t0 = time.monotonic()
    events, answer, run_dir = run_scenario(tmp_path, "hf_trainer.py", "--hang-step", "7", "--save-steps", "4")
    one, two = check_common(events, "transformers")
    # The Trainer's own checkpoint-4, then the rescue save taken from the signal handler
    # while the main thread waited for step 7's batch (accelerate's loader fetches one batch
    # ahead, so step 6's had not come out yet): the Trainer's state after step 5.
    saved = [(Path(c.path).name, c.kind) for c in of(one, "checkpoint") if c.ok]
    assert saved == [("checkpoint-4", "periodic"), ("checkpoint-5", "rescue")], saved
    rescue = [c for c in of(one, "checkpoint") if c.kind == "rescue"][0]
    assert verify_path(rescue.path).ok, verify_path(rescue.path)
    [restart] = of(one, "restart")
    assert restart.resume_from == rescue.path
    assert "resume_from_checkpoint" in of(two, "info", "runner.resume")[0].text
    # The step goes on: the resumed Trainer's first steps are 5 (where it resumed), 6, 7.
    steps = [(p.epoch - 1) * PER_EPOCH + p.batch for p in side(run_dir, 2, "progress")]
    assert steps[:3] == [5, 6, 7], steps
    assert steps[-1] == 2 * PER_EPOCH
    check_planned(answer)
    assert Path(answer.path).name == f"checkpoint-{PER_EPOCH + answer.batch}"
    print(f"transformers scenario: {time.monotonic() - t0:.1f} s")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("package", ["lightning"])
def test_lightning_script_hang_rescue_resume_and_save_request(tmp_path, package):
    needs(package)
    t0 = time.monotonic()
    events, answer, run_dir = run_scenario(
        tmp_path, "lightning_train.py", "--package", package, "--hang-batch", "7", "--save-steps", "4"
    )
    one, two = check_common(events, "lightning")
    # ModelCheckpoint's step-4 file, then the rescue save taken from the signal handler
    # while the main thread waited for batch 7: the state after batch 6.
    kinds = [(c.kind, c.batch) for c in of(one, "checkpoint") if c.ok]
    assert kinds == [("periodic", 4), ("rescue", 6)], kinds
    rescue = [c for c in of(one, "checkpoint") if c.kind == "rescue"][0]
    assert Path(rescue.path).parent.name == "checkpoints" and verify_path(rescue.path).ok
    [restart] = of(one, "restart")
    assert restart.resume_from == rescue.path
    assert "ckpt_path" in of(two, "info", "runner.resume")[0].text
    batches = [(p.epoch, p.batch) for p in side(run_dir, 2, "progress")]
    assert batches[0] == (1, 7), batches  # nothing redone, nothing skipped
    assert batches[-1] == (2, PER_EPOCH)
    check_planned(answer)
    assert Path(answer.path).name == f"lightning-planned-e2-b{answer.batch}.ckpt"
    print(f"lightning scenario: {time.monotonic() - t0:.1f} s")


@pytest.mark.timeout(120)
def test_pytorch_lightning_through_the_bootstrap_alone(tmp_path):
    """The other import name, through the real bootstrap (no agent): it attaches, reports
    progress and ModelCheckpoint's saves, and takes the preset's workers (2 -> 0)."""
    needs("pytorch_lightning")
    import subprocess
    import sys

    from trainctl.agent.zero_code import instrument_env

    run = tmp_path / "run"
    run.mkdir()
    side_file = run / "side-1.jsonl"
    side_file.touch()
    (tmp_path / "B.toml").write_text("[dataloader]\nworkers = 0\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAINCTL_")}
    base.update(
        TRAINCTL_EVENTS_PATH=str(side_file),
        TRAINCTL_RUN_DIR=str(run),
        TRAINCTL_PRESET="B",
        TRAINCTL_PRESET_FILE=str(tmp_path / "B.toml"),
    )
    r = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "lightning_train.py"),
            str(tmp_path / "out"),
            "--package",
            "pytorch_lightning",
            "--epochs",
            "1",
            "--items",
            "16",
        ],
        env=instrument_env(base, run),
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "done global_step=4" in r.stdout
    infos = side(run, 1, "info")
    attached = [i.text for i in infos if i.key == "instrument.attached.lightning"]
    assert attached[0].startswith("integration attached: pytorch_lightning 2."), attached
    assert (
        "runner.save_on_request" in [i.key for i in infos]
        and infos[-1].key == "instrument.attached.lightning"
    )
    assert [w.id for w in side(run, 1, "warning")] == ["trainctl.preset_overrides"]
    assert [(p.epoch, p.batch, p.batches) for p in side(run, 1, "progress")][-1] == (1, 4, 4)
    [ckpt] = side(run, 1, "checkpoint")
    assert ckpt.ok and ckpt.kind == "epoch" and ckpt.path.endswith("epoch=0-step=4.ckpt"), ckpt
