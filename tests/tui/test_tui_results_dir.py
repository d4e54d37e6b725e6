"""Issue 28, item 7: the dashboard shows where the run's results go (Ultralytics' save_dir),
on the Progress panel's lower border, at 120x40 and at 80x24 (the start of a long path cut)."""

from __future__ import annotations

import os

import pytest
from tui_helpers import replayed, screen_text, wait_for

from trainctl.core import events as ev

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_the_results_dir_is_on_the_progress_panel(make_app, agent, size):
    home = os.path.expanduser("~")
    save_dir = f"{home}/projects/boxes/runs/detect/train2"
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await replayed(pilot, agent)
        assert "results" not in screen_text(app)  # none said yet: nothing shown
        agent.append(ev.results_info(agent.journal[-1].ts + 1, save_dir))
        await replayed(pilot, agent)
        await wait_for(pilot, lambda: "results " in screen_text(app), what="the results line")
        text = screen_text(app)
        line = next(ln for ln in text.splitlines() if "results " in ln)
        assert "/detect/train2 " in line, line  # the end of the path, always
        if size[0] >= 120:
            assert "results ~/projects/boxes/runs/detect/train2 " in line, line
        assert app.dashboard.model.warnings_version and all(  # not a warning row
            "results in" not in w.text for w in app.dashboard.model.warning_rows()
        )
