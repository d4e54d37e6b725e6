"""Snapshots of the dashboard (80x24, 160x48) and the editor over the journal fixture.

The clock is fixed (the journal's last event + 2 s), local time is UTC, cursors do not
blink.  Update with ``pytest tests/tui/test_tui_snapshots.py --snapshot-update`` and look
at the SVGs before committing them.
"""

from __future__ import annotations

import pytest
from textual.widgets import Input, TextArea
from tui_helpers import replayed, shown, tick, wait_for

from trainctl.core.events import Log
from trainctl.tui.model import NOTE_PREFIX
from trainctl.tui.screens.preset_editor import PresetEditorScreen
from trainctl.tui.widgets.loss_chart import LossChart

pytestmark = pytest.mark.timeout(60)


def trainer_lines(lines) -> int:
    """The trainer's lines among the log view's (trainctl's notes are there too)."""
    return sum(1 for line in lines if not line.startswith(NOTE_PREFIX))


def settle(agent, journal, *keys: str, editor: bool = False, log: tuple[str, ...] = ()):
    async def run_before(pilot) -> None:
        app = pilot.app
        await replayed(pilot, agent)
        agent.emit(tick(journal[-1].ts + 1))
        if log:
            agent.emit(Log(journal[-1].ts + 1, lines=log))
        await wait_for(
            pilot,
            lambda: (
                app.dashboard.model.tick is not None and trainer_lines(app.dashboard.model.log) == len(log)
            ),
            what="tick and log",
        )
        app.dashboard.query_one(LossChart).flush()
        for key in keys:
            await pilot.press(key)
        if editor:
            await shown(pilot, PresetEditorScreen)
            for widget in app.screen.query(Input):
                widget.cursor_blink = False
            for area in app.screen.query(TextArea):
                area.cursor_blink = False
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_dashboard(snap_compare, make_app, agent, journal, size):
    assert snap_compare(make_app(), terminal_size=size, run_before=settle(agent, journal))


def test_dashboard_drawn_at_every_update(snap_compare, make_app, agent, journal, monkeypatch):
    """A loaded machine's timing: every chart update draws at once, the first ones before the
    layout has settled; the chart is drawn again at its final size (the 80x24 snapshot)."""
    from trainctl.tui.widgets import loss_chart

    monkeypatch.setattr(loss_chart, "MIN_INTERVAL", 0.0)
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=settle(agent, journal))


def test_dashboard_with_log(snap_compare, make_app, agent, journal):
    lines = tuple(
        f"       3/3         0G      1.301      1.482      1.094         41         64: "
        f" {i * 100 // 300:>2}% ━━━━───────── {i}/300 2.1it/s 1:0{i % 10}<2:00"
        for i in range(120, 141)
    )
    assert snap_compare(
        make_app(), terminal_size=(160, 48), run_before=settle(agent, journal, "l", log=lines)
    )


def test_editor(snap_compare, make_app, agent, journal):
    assert snap_compare(
        make_app(), terminal_size=(160, 48), run_before=settle(agent, journal, "e", editor=True)
    )
