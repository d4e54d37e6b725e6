"""The dashboard driven by its keys against a real agent and a real PyTorch trainer.

The pilot tests in tests/tui run the app against a FakeAgent; this one runs it against
`trainctl run` itself (through the real local client, as `trainctl attach` does), so a
command that only the fake understands cannot pass.  One run: the preset editor saves
preset A for the next restart (write_preset + set_next_preset), `r` restarts and the new
attempt runs with the edited file, `d` dumps stacks, `a` toggles auto-recovery, `p` picks
preset B and restarts with it, `s` stops.  (`f` over ssh: tests/e2e/test_remote_run.py.)
"""

from __future__ import annotations

import sys

import pytest

from tests.e2e.conftest import ROOT, read_journal, start_trainctl, wait_until
from tests.tui.tui_helpers import edit_workers_and_save, screen_text, shown, wait_for
from trainctl.client.connection import local_client
from trainctl.tui.app import TrainctlApp
from trainctl.tui.screens.confirm import ConfirmScreen
from trainctl.tui.screens.preset_picker import PresetPicker

TRAIN_LOOP = ROOT / "tests" / "helpers" / "scripts" / "train_loop.py"

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]


async def test_every_key_against_a_real_agent(tmp_path):
    run_dir = tmp_path / "run"
    tc = start_trainctl(
        [
            "run",
            "--headless",
            "--no-tmux",
            "--preset",
            "A",
            "--fallback",
            "B",
            "--run-dir",
            run_dir,
            "--",
            sys.executable,
            TRAIN_LOOP,
            "--epochs",
            "3",
            "--batches",
            "400",
            "--batch-time",
            "0.03",
        ]
    )
    try:
        wait_until(lambda: (run_dir / "agent.sock").exists(), 30, what="the agent's socket")
        app = TrainctlApp(lambda: local_client(run_dir))
        async with app.run_test(size=(160, 48)) as pilot:
            model = app.dashboard.model
            await wait_for(pilot, lambda: model.progress is not None, 60, "progress")
            assert (model.preset, model.attempt) == ("A", 1)

            # Edit A (the running preset): workers 2 -> 1, saved for the next restart.
            editor = await edit_workers_and_save(pilot, "ctrl+t", "2", "1")
            await pilot.press("y")
            preset_a = run_dir / "presets" / "A.toml"
            await wait_for(pilot, lambda: "workers = 1" in preset_a.read_text(), 20, "A.toml saved")
            assert "# Preset A" in preset_a.read_text()  # comments kept
            await wait_for(pilot, lambda: not editor.dirty, 10, "editor clean")
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is not editor, 10, "editor closed")
            assert model.attempt == 1  # saved, not restarted

            # r: restart now; the new attempt runs A as edited.
            await pilot.press("r")
            await shown(pilot, ConfirmScreen)
            await pilot.press("y")
            await wait_for(pilot, lambda: model.attempt == 2, 60, "attempt 2")
            await wait_for(
                pilot,
                lambda: "attempt=2 workers=1" in (run_dir / "train.log").read_text(),
                30,
                "attempt 2 with 1 worker",
            )
            await wait_for(
                pilot,
                lambda: (
                    model.progress is not None
                    and model.progress.ts > max(e.ts for e in read_journal(run_dir) if e.type == "start")
                ),
                60,
                "progress of attempt 2",
            )

            # d: stacks dumped, where the dashboard can say.
            await pilot.press("d")
            await wait_for(
                pilot,
                lambda: any(e.type == "info" and "stacks dumped" in e.text for e in read_journal(run_dir)),
                60,
                "stacks",
            )
            assert any((run_dir / "stacks").iterdir())

            # a: auto-recovery off, and the header says so.
            await pilot.press("a")
            await wait_for(pilot, lambda: not model.auto_recover, 20, "auto-recover off")
            await wait_for(pilot, lambda: "auto-recover OFF" in screen_text(app), 10, "header")

            # p: pick B (listed from the run's presets) and restart with it.
            await pilot.press("p")
            await shown(pilot, PresetPicker)
            await pilot.press("end", "enter")  # B is last
            await wait_for(pilot, lambda: model.attempt == 3 and model.preset == "B", 60, "attempt 3 on B")
            await wait_for(
                pilot,
                lambda: "attempt=3 workers=0" in (run_dir / "train.log").read_text(),
                30,
                "attempt 3 with no workers",
            )

            # s: stop (confirmed): the trainer is killed, not restarted.
            await pilot.press("s")
            await shown(pilot, ConfirmScreen)
            await pilot.press("y")
            await wait_for(pilot, lambda: model.state == "STOPPED", 60, "the run to end")
            assert model.state_reason == "stopped by the user"
        result = tc.wait(60)
    finally:
        tc.kill()
    events = read_journal(run_dir)
    starts = [(e.attempt, e.preset) for e in events if e.type == "start"]
    assert starts == [(1, "A"), (2, "A"), (3, "B")], starts
    assert [e.type for e in events].count("restart") == 2
    assert result.returncode == 130, result.describe()  # stopped, like Ctrl-C
    log = (run_dir / "train.log").read_text()
    assert "attempt=1 workers=2" in log and "attempt=2 workers=1" in log
