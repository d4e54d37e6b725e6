"""The dashboard shows where the run is on its ladder: the agent's line, from its ticks."""

from __future__ import annotations

from tui_helpers import replayed, screen_text, tick, wait_for

LINE = "rung A.w2 (2 of 3), stable 14 m, next step up after 6 m if it pays"


async def test_the_ladder_line_shows_under_the_projection(make_app, agent, journal):
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await replayed(pilot, agent)
        assert "rung " not in screen_text(app)  # no ladder, no line
        agent.emit(tick(journal[-1].ts + 1, ladder=LINE))
        await wait_for(pilot, lambda: LINE in screen_text(app), what="the ladder line")
