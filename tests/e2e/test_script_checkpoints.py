"""A plain script that saves its own checkpoints (tests/helpers/scripts/saves_own.py: its own
argparse ``--resume``, its own ``torch.save``, 2 DataLoader workers), run as the README says:
trainctl finds what it writes (inotify, agent/checkpoint_watch.py), checks and journals it,
restarts a hang without the resume flag before the first save and with it after, from a
copy in the run directory that the script's next saves cannot change."""

from __future__ import annotations

import json

import pytest
import torch

from tests.e2e.conftest import PYTHON, ROOT, run_trainctl
from trainctl.core import events as E

pytestmark = pytest.mark.e2e
SAVES_OWN = ROOT / "tests" / "helpers" / "scripts" / "saves_own.py"


def hangs_before_and_after_its_first_save(python: str) -> list[str]:
    """`trainctl run` of saves_own.py with its own resume flag: 12 steps, a save every 5,
    a DataLoader deadlock in attempt 1 at step 3 (before the first save) and in attempt 2
    at step 8 (after it)."""
    return [
        "run",
        "--json",
        "--stall-timeout",
        "3",
        "--resume-arg=--resume",
        "--resume-arg={checkpoint}",
        "--",
        python,
        str(SAVES_OWN),
        "--steps",
        "12",
        "--save-every",
        "5",
        "--step-time",
        "0.3",
        "--hang",
        "1:3",
        "--hang",
        "2:8",
    ]


def _starts(res) -> list[E.Start]:
    return [e for e in res.events if isinstance(e, E.Start)]


def _restarts(res) -> list[E.Restart]:
    return [e for e in res.events if isinstance(e, E.Restart)]


@pytest.mark.timeout(110)
def test_a_script_saving_out_ckpt_pt_resumes_with_its_own_flag_and_keeps_its_checkpoint(tmp_path):
    ckpt = tmp_path / "out" / "ckpt.pt"
    res = run_trainctl(
        hangs_before_and_after_its_first_save(PYTHON),
        cwd=tmp_path,
        timeout=100,
    )
    assert res.returncode == 0, res.describe()
    one, two, three = _starts(res)
    # Attempt 2: no checkpoint yet, so no resume flag (it would crash the script).
    assert "--resume" not in two.command, two.command
    found = [e for e in res.events if isinstance(e, E.Checkpoint) and e.kind == "script"]
    assert found and all(e.ok for e in found), found
    # its position: the run's progress when the save was seen (the console is read every 0.5 s)
    assert (
        found[0].path == str(ckpt)
        and 3 <= (found[0].batch or 0) <= 5
        and "written by the script" in found[0].detail
    )
    first, second = _restarts(res)
    assert first.resume_from is None and first.resume_source is None, first
    copy = second.resume_copy
    assert copy is not None and copy.startswith(str(res.run_dir)), second
    assert (second.resume_source, second.resume_from) == (str(ckpt), copy), second
    assert second.resume_age_s is not None and 0 <= second.resume_age_s < 60, second
    assert second.resume_redone is not None and second.resume_redone >= 2, second  # steps 6, 7 (8 hung)
    assert list(three.command[-2:]) == ["--resume", copy], three.command
    log = (res.run_dir / "train.log").read_text()
    assert log.count("started from scratch") == 2 and f"resumed from {copy} at step 5" in log, log
    # The script saved out/ckpt.pt again at step 10 (the same inode, rewritten): the copy
    # the restart resumed from is still step 5's.
    assert torch.load(ckpt, weights_only=False)["step"] == 10
    assert torch.load(copy, weights_only=False)["step"] == 5
    infos = [e.text for e in res.events if isinstance(e, E.Info) and e.key.startswith("checkpoints.")]
    assert any("inotify" in t for t in infos) and any("kept a copy" in t for t in infos), infos
    status = json.loads(run_trainctl(["status", str(res.run_dir), "--json"], timeout=30).stdout)
    assert status["resumed"]["source"] == str(ckpt) and status["resumed"]["from"] == copy, status
    text = run_trainctl(["status", str(res.run_dir)], timeout=30).stdout
    assert f"resumed from the copy {copy} of {ckpt}" in text, text
    md = run_trainctl(["report", str(res.run_dir), "--md", "--stdout"], timeout=60).stdout
    assert f"resumed from the copy {copy} of {ckpt}" in md, md


@pytest.mark.timeout(90)
def test_a_script_writing_checkpoint_folders_resumes_from_the_newest_whole_folder(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(
        'kind = "command"\n'
        f'command = ["{PYTHON}", "{SAVES_OWN}", "--folders", "--steps", "9", "--save-every", "3", '
        '"--hang", "1:8"]\n'
        'resume_args = ["--resume", "{checkpoint}"]\n'
        'checkpoints = ["out/checkpoint-*"]\n'
    )
    res = run_trainctl(["run", "--json", "--stall-timeout", "3", str(job)], cwd=tmp_path, timeout=80)
    assert res.returncode == 0, res.describe()
    found = [e for e in res.events if isinstance(e, E.Checkpoint) and e.kind == "script"]
    # each folder once, as a whole (its two files), never the files on their own
    paths = [e.path for e in found]
    assert paths[:2] == [str(tmp_path / "out" / f"checkpoint-{s}") for s in (3, 6)], paths
    assert all(e.ok and "2 checkpoint files complete" in e.detail for e in found), found
    (restart,) = _restarts(res)
    assert restart.resume_source == str(tmp_path / "out" / "checkpoint-6"), restart
    assert restart.resume_from == restart.resume_copy and restart.resume_copy.endswith("/checkpoint-6")
    log = (res.run_dir / "train.log").read_text()
    assert f"resumed from {restart.resume_copy} at step 6" in log, log


@pytest.mark.timeout(90)
def test_a_nanogpt_like_script_resumes_by_its_own_flag_with_no_path_after_its_main_process_hung(tmp_path):
    """nanoGPT's way (bench/real_scripts.toml runs nanoGPT itself): no DataLoader worker,
    ``iter N: loss X`` lines, out/ckpt.pt saved in place, and ``--init_from=resume``, a flag
    with no path that makes the script read its own file.  The flag is given only once the
    file exists; the main process blocking at step 8 is the hang."""
    args = ["run", "--json", "--stall-timeout", "3", "--resume-arg=--init-from", "--resume-arg=resume"]
    args += ["--", PYTHON, str(SAVES_OWN), "--prints", "nanogpt", "--workers", "0"]
    args += ["--steps", "10", "--save-every", "5", "--step-time", "0.2", "--hang", "1:8"]
    res = run_trainctl(args, cwd=tmp_path, timeout=80)
    assert res.returncode == 0, res.describe()
    one, two = _starts(res)
    assert "--init-from" not in one.command and list(two.command[-2:]) == ["--init-from", "resume"], two
    batches = [e.batch for e in res.events if isinstance(e, E.Progress)]
    # "iter N" is the batch (the journal keeps some of them); the restart goes on after step 5
    assert batches[0] == 1 and batches[-1] == 10 and 6 in batches, batches
    losses = [e.losses for e in res.events if isinstance(e, E.Progress)]
    assert all(set(x) == {"loss"} for x in losses), losses
    (restart,) = _restarts(res)
    assert restart.resume_source == str(tmp_path / "out" / "ckpt.pt"), restart
    assert restart.resume_redone is not None and restart.resume_redone >= 2, restart  # steps 6, 7
    log = (res.run_dir / "train.log").read_text()
    assert "resumed from out/ckpt.pt at step 5" in log and log.rstrip().endswith("done"), log[-600:]


@pytest.mark.timeout(90)
def test_an_imagenet_like_scripts_scientific_loss_is_read_and_it_resumes_from_its_file(tmp_path):
    """pytorch/examples imagenet's console (``Epoch: [0][ 7/10]`` and ``Loss 1.2300e+00
    (1.3100e+00)``: the value, its running average in parentheses) under the README's
    command, its ``--resume PATH`` filled with trainctl's copy after a worker's deadlock."""
    args = ["run", "--json", "--stall-timeout", "3", "--resume-arg=--resume", "--resume-arg={checkpoint}"]
    args += ["--", PYTHON, str(SAVES_OWN), "--prints", "imagenet"]
    args += ["--steps", "10", "--save-every", "5", "--step-time", "0.2", "--hang", "1:8"]
    res = run_trainctl(args, cwd=tmp_path, timeout=80)
    assert res.returncode == 0, res.describe()
    progress = [e for e in res.events if isinstance(e, E.Progress)]
    assert progress and all(e.batches == 10 and e.epoch == 0 for e in progress), progress[:3]
    log = (res.run_dir / "train.log").read_text()
    first = next(ln for ln in log.splitlines() if ln.startswith("Epoch: [0][ 0/10]"))
    value, average = first.split("Loss ")[1].split()
    assert progress[0].losses == {"Loss": float(value)}, (progress[0], average)  # the value, not its average
    (restart,) = _restarts(res)
    assert restart.resume_copy is not None and restart.resume_source == str(tmp_path / "out" / "ckpt.pt")
    assert f"resumed from {restart.resume_copy} at step 5" in log, log[-600:]
