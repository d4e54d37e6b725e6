"""Waiting helpers for Pilot tests (poll the app instead of sleeping a guessed time)."""

from __future__ import annotations

import time
from collections.abc import Callable

from textual.pilot import Pilot

from trainctl.core.events import Tick

TICK = dict(
    phase="train",
    idle_s=0.6,
    threshold_s=60.0,
    auto_recover=True,
    processes=(
        {
            "pid": 48302,
            "role": "main",
            "name": "python",
            "status": "running",
            "cpu_percent": 101.0,
            "rss_bytes": 3_100_000_000,
            "num_threads": 24,
        },
        {
            "pid": 48330,
            "role": "child",
            "name": "python",
            "status": "sleeping",
            "cpu_percent": 0.0,
            "rss_bytes": 210_000_000,
            "num_threads": 3,
        },
    ),
    gpu=None,
)


def tick(ts: float, **changes: object) -> Tick:
    return Tick(ts, **{**TICK, **changes})  # type: ignore[arg-type]


async def wait_for(
    pilot: Pilot, predicate: Callable[[], object], timeout: float = 10.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await pilot.pause(0.01)


async def replayed(pilot: Pilot, agent) -> None:
    """Wait until the dashboard has applied every journal event the agent holds."""
    app = pilot.app
    last = agent.journal[-1].seq
    await wait_for(pilot, lambda: app.dashboard.model.last_seq == last, what=f"seq {last}")


def screen_text(app) -> str:
    """The characters on the screen, one line per row."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(segment.text for segment in strip) for strip in strips)


async def shown(pilot: Pilot, screen_type: type) -> None:
    """Wait until the active screen is a ``screen_type`` and has been drawn."""
    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, screen_type), what=screen_type.__name__)
    await wait_for(pilot, lambda: app.screen.is_mounted and app.screen.size.width > 0, what="layout")
    await pilot.pause()
    await pilot.pause()


async def edit_workers_and_save(pilot: Pilot, save_key: str, old: str, new: str) -> object:
    """On the dashboard: `e` opens the running preset; set dataloader.workers from ``old``
    to ``new``; ``save_key`` (ctrl+s, ctrl+r, ctrl+t) brings up the diff to confirm.
    Returns the editor screen (the confirm modal is showing)."""
    from textual.widgets import Input

    from trainctl.tui.screens.confirm import ConfirmScreen
    from trainctl.tui.screens.preset_editor import PresetEditorScreen

    app = pilot.app
    await pilot.press("e")
    await shown(pilot, PresetEditorScreen)
    editor = app.screen
    workers = editor.query_one("#field-dataloader-workers", Input)
    assert workers.value == old, workers.value
    workers.value = new
    await pilot.pause()
    await pilot.press(save_key)
    await shown(pilot, ConfirmScreen)
    assert f"+workers = {new}" in app.screen.body.code
    return editor
