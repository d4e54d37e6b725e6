"""Write docs/screenshots/dashboard.svg and editor.svg from the journal fixture.

    .venv/bin/python tests/tui/make_screenshots.py

The same FakeAgent, fixed clock and UTC as the snapshot tests; run it again after a
visible change and look at the SVGs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from textual.widgets import Input, TextArea  # noqa: E402
from tui_fakes import FakeAgent, replay_journal  # noqa: E402
from tui_helpers import replayed, shown, tick, wait_for  # noqa: E402

from trainctl.tui.app import TrainctlApp  # noqa: E402
from trainctl.tui.screens.preset_editor import PresetEditorScreen  # noqa: E402
from trainctl.tui.widgets.loss_chart import LossChart  # noqa: E402

RUN_DIR = "/home/ana/runs/yolo-rocm-20251115"
HELLO = {
    "version": "0.1.0",
    "job": "yolo-rocm",
    "run_dir": RUN_DIR,
    "host": "gpu-box",
    "state": "RUNNING",
    "auto_recover": True,
    "preset": "B",
    "fallback": "B",
}


async def shoot(out: Path, tmp: Path) -> None:
    presets = {
        n: Path(shutil.copy(ROOT / "src" / "trainctl" / "presets" / f"{n}.toml", tmp / f"{n}.toml"))
        for n in ("A", "B")
    }
    journal = replay_journal()
    agent = FakeAgent(journal, dict(HELLO), presets, shown_dir=f"{RUN_DIR}/presets")
    now = journal[-1].ts + 2.0
    app = TrainctlApp(agent.client, clock=lambda: now)
    async with app.run_test(size=(160, 48)) as pilot:
        await replayed(pilot, agent)
        agent.emit(tick(journal[-1].ts + 1))
        await wait_for(pilot, lambda: app.dashboard.model.tick is not None, what="tick")
        app.dashboard.query_one(LossChart).flush()
        await pilot.pause()
        app.save_screenshot("dashboard.svg", str(out))
        await pilot.resize_terminal(120, 40)
        await pilot.press("e")
        await shown(pilot, PresetEditorScreen)
        for widget in [*app.screen.query(Input), *app.screen.query(TextArea)]:
            widget.cursor_blink = False
        app.screen.query_one("#field-dataloader-workers", Input).value = "-1"
        await pilot.pause()
        app.save_screenshot("editor.svg", str(out))


def main() -> None:
    os.environ["TZ"] = "UTC"
    time.tzset()
    out = ROOT / "docs" / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(shoot(out, Path(tmp)))
    print(f"wrote {out / 'dashboard.svg'} and {out / 'editor.svg'}")


if __name__ == "__main__":
    main()
