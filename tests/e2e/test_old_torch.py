"""The seeds' stack: a plain PyTorch script on Debian's python3-torch 1.13.1 (the system
Python at /usr/bin/python3, beside the venv's torch), run as the README says.  Its console
read, a DataLoader deadlock caught with its verdict, the restart resumed from the script's
own checkpoint (tests/helpers/scripts/saves_own.py: its own ``torch.save`` and
``--resume``, 2 forked workers), and preset B's ``workers = 0`` acting on its DataLoader
through the bootstrap.  CI installs the package (.ci/install-old-torch.sh) and sets
TRAINCTL_REQUIRE_OLD_TORCH=1, which makes its absence a failure."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import ROOT, run_trainctl, start_trainctl
from tests.e2e.test_script_checkpoints import hangs_before_and_after_its_first_save
from trainctl.core import events as E

pytestmark = pytest.mark.e2e
SAVES_OWN = ROOT / "tests" / "helpers" / "scripts" / "saves_own.py"
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def old_torch() -> str:
    """/usr/bin/python3 when its torch is a 1.x (Debian's python3-torch)."""
    try:
        out = subprocess.run(
            [SYSTEM_PYTHON, "-c", "import torch; print(torch.__version__)"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        version = out.stdout.strip() if out.returncode == 0 else ""
    except OSError:
        version = ""
    if not version.startswith("1."):
        why = f"no torch 1.x for {SYSTEM_PYTHON} (got {version or 'none'}): apt-get install python3-torch"
        if os.environ.get("TRAINCTL_REQUIRE_OLD_TORCH") == "1":
            pytest.fail(f"{why}, and TRAINCTL_REQUIRE_OLD_TORCH=1", pytrace=False)
        pytest.skip(why)
    return version


@pytest.mark.timeout(120)
def test_a_plain_script_on_torch_1_13_hangs_twice_and_resumes_from_its_own_checkpoint(tmp_path, old_torch):
    res = run_trainctl(
        hangs_before_and_after_its_first_save(SYSTEM_PYTHON),
        cwd=tmp_path,
        timeout=110,
    )
    assert res.returncode == 0, res.describe()
    one, two, three = [e for e in res.events if isinstance(e, E.Start)]
    assert "--resume" not in two.command, two.command  # no checkpoint yet: no resume flag
    verdicts = [e for e in res.events if isinstance(e, E.StallDiagnosis)]
    assert [v.diagnosis for v in verdicts] == ["deadlock", "deadlock"], verdicts
    assert all("waits for a DataLoader batch" in v.detail for v in verdicts), verdicts[0].detail
    found = [e for e in res.events if isinstance(e, E.Checkpoint) and e.kind == "script"]
    assert found and all(e.ok for e in found), found  # torch 1.13's zip read by the gate
    restarts = [e for e in res.events if isinstance(e, E.Restart)]
    copy = restarts[1].resume_from
    assert copy is not None and copy.startswith(str(res.run_dir)), restarts
    assert list(three.command[-2:]) == ["--resume", copy], three.command
    losses = [e.losses.get("loss") for e in res.events if isinstance(e, E.Progress)]
    assert losses and all(x is not None for x in losses), losses
    log = (res.run_dir / "train.log").read_text()
    assert f"resumed from {copy} at step 5" in log and log.rstrip().endswith("done"), log[-800:]


@pytest.mark.timeout(90)
def test_preset_b_turns_the_scripts_two_workers_into_none_on_torch_1_13(tmp_path, old_torch, monkeypatch):
    monkeypatch.delenv("TRAINCTL_LOADER_OVERRIDE", raising=False)  # the override is what is tested
    b = tmp_path / "B.toml"
    b.write_text('description = "test B"\n[dataloader]\nworkers = 0\n')
    args = ["run", "--json", "--preset", str(b), "--", SYSTEM_PYTHON, str(SAVES_OWN)]
    args += ["--steps", "30", "--save-every", "100", "--step-time", "0.1"]
    with start_trainctl(args, cwd=tmp_path) as tc:
        start = tc.wait_event(lambda e: e.type == "start", 60, "the start")
        tc.wait_event(lambda e: e.type == "progress", 60, "the first batch")
        try:
            kids = [k for k in psutil.Process(start.pid).children(recursive=True) if k.is_running()]
        except psutil.NoSuchProcess:
            kids = []
        res = tc.wait(60)
    assert res.returncode == 0, res.describe()
    assert kids == [], kids  # the script's num_workers=2: none under preset B
    [said] = [e for e in res.events if e.type == "warning" and e.id == "trainctl.preset_overrides"]
    assert said.text == "preset B changes the script's DataLoader: num_workers 2 -> 0", said.text
    assert Path(res.run_dir / "train.log").read_text().rstrip().endswith("done")
