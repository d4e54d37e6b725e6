"""Pilot tests of what a newcomer meets first (issue 28), at 80x24 and 120x40: the footer
keeps `? Help` and `q Quit`, the header keeps the job's name, the warnings panel says what
needs a person in words (counted, dismissable), the log view scrolls back, pans and finds,
acknowledgements are toasts of the outcome, `k` opens the last stack dump, and `r` says
what a restart will do to this run."""

from __future__ import annotations

import dataclasses

import pytest
from tui_helpers import replayed, screen_text, shown, wait_for

from trainctl.core import events as ev
from trainctl.inside.report import SAVE_ON_REQUEST_KEY
from trainctl.tui.screens.confirm import ConfirmScreen
from trainctl.tui.screens.stacks import StacksScreen
from trainctl.tui.widgets.log_tail import LogTail
from trainctl.tui.widgets.warnings_panel import WarningsPanel

pytestmark = pytest.mark.timeout(60)
SIZES = [(80, 24), (120, 40)]


def toasts(app) -> list[str]:
    return [n.message for n in app._notifications]


@pytest.mark.parametrize("size", SIZES)
async def test_footer_keeps_help_and_quit_and_the_header_the_job_name(make_app, agent, size):
    agent.hello = {**agent.hello, "job": "yolov8n-coco-finetune", "host": "gpu-box-07"}
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await replayed(pilot, agent)
        dash = app.dashboard
        dash.attention = 3  # other runs need attention: the header's busiest
        dash._connection = "disconnected (run over) — retrying in 4s"
        dash._push_header()
        await pilot.pause()
        await wait_for(pilot, lambda: "Quit" in screen_text(app).splitlines()[-1], what="footer")
        lines = screen_text(app).splitlines()
        assert "yolov8n-coco-finetune" in lines[0], lines[0]
        if size[0] >= 120:
            assert "yolov8n-coco-finetune@gpu-box-07" in lines[0], lines[0]
        footer = lines[-1]
        assert "? Help" in footer and "q Quit" in footer, footer


@pytest.mark.parametrize("size", SIZES)
async def test_warnings_panel_says_what_needs_a_person_counted_and_dismissable(
    make_app, agent, journal, size
):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await replayed(pilot, agent)
        t = journal[-1].ts
        agent.append(
            ev.Info(t + 1, "integration attached: ultralytics 8.4.190", "instrument.attached.ultralytics")
        )
        agent.append(ev.Info(t + 1, "auto-recovery off", "auto_recover"))
        agent.append(
            ev.Warning(
                t + 2,
                "trainctl.preset_overrides",
                "warning",
                "preset B changes the script's model.train(): workers 2 -> 0",
                "Under trainctl the preset wins",
                source="trainctl",
            )
        )
        panel = app.dashboard.query_one(WarningsPanel)
        await wait_for(pilot, lambda: len(panel.rows) == 3, what="three rows")
        text = screen_text(app)
        assert "Warnings (3)" in text, text
        assert "preset B changes" in text and "no batch for 61 s" in text, text
        for internal in (
            "trainctl.preset_overrides",
            "stall.deadlock",
            "auto_recover",
            "instrument.",
            "integration attached",
            "rocm.miopen",
        ):
            assert internal not in text, internal  # ids and info notes stay out
        assert [r.severity for r in panel.rows] == ["warning", "error", "warning"]
        # x dismisses the highlighted row (here the newest) until it happens again
        from textual.widgets import DataTable

        panel.query_one(DataTable).move_cursor(row=0)
        await pilot.press("x")
        await wait_for(pilot, lambda: len(panel.rows) == 2, what="dismissed")
        assert "Warnings (2)" in screen_text(app) and panel.border_subtitle == "x dismiss · 1 dismissed"
        assert "trainctl.preset_overrides" not in [r.id for r in panel.rows]
        assert toasts(app)[-1].startswith("dismissed until it happens again: preset B changes")
        agent.append(
            ev.Warning(
                t + 3,
                "trainctl.preset_overrides",
                "warning",
                "preset B changes the script's model.train(): workers 2 -> 0",
                "",
                source="trainctl",
            )
        )
        await wait_for(pilot, lambda: len(panel.rows) == 3, what="back once it recurs")
        assert panel.rows[0].count == 2


@pytest.mark.parametrize("size", SIZES)
async def test_log_view_scrolls_back_pans_finds_and_holds_trainctl_s_notes(make_app, agent, journal, size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await replayed(pilot, agent)
        t = journal[-1].ts
        lines = [f"   2/3   1.2G   1.301   1.48   batch {i}/300" for i in range(400)]
        lines[123] = "RuntimeError: CUDA error: an illegal memory access was encountered"
        lines[300] = "x" * 400  # wider than any terminal
        agent.emit(ev.Log(t, lines=tuple(lines)))
        agent.append(
            ev.Info(t + 1, "integration attached: ultralytics 8.4.190", "instrument.attached.ultralytics")
        )
        dash = app.dashboard
        await wait_for(pilot, lambda: len(dash.model.log) >= 401, what="log lines")
        await pilot.press("l")
        log = dash.query_one(LogTail)
        await wait_for(pilot, lambda: log.display and log.region.height > 0, what="log view")
        await pilot.pause()
        assert dash.focused is log
        assert "· trainctl: integration attached: ultralytics 8.4.190" in log.lines
        assert log.border_title.startswith("Trainer output · 4") and "/ find" in log.border_subtitle
        bottom = log.scroll_y
        assert bottom > 0
        await pilot.press("pageup", "pageup")
        assert log.scroll_y < bottom  # scrolled back...
        back = log.scroll_y
        agent.emit(ev.Log(t + 2, lines=("a newer line",)))
        await wait_for(pilot, lambda: log.lines[-1] == "a newer line", what="new line")
        assert log.scroll_y == back  # ...and it stays there
        await pilot.press("right", "right", "right")
        assert log.scroll_x > 0  # long lines pan, not cut
        # / finds (any case), the match is in view and said in the title
        await pilot.press("slash")
        await wait_for(pilot, lambda: dash.query_one("#log-search").has_focus, what="search box")
        await pilot.press(*"cuda", "space", *"error")
        search = dash.query_one("#log-search")
        assert search.value == "cuda error", search.value
        await pilot.press("enter")
        at = list(log.lines).index(lines[123])  # after trainctl's notes of the replay
        await wait_for(pilot, lambda: log.match == at, what="the match")
        assert log.scroll_y <= at < log.scroll_y + log.size.height
        assert f"at line {at + 1} (1 match)" in log.border_title, log.border_title
        assert dash.focused is log
        await pilot.press("n")  # the only match: it stays on it
        assert log.match == at
        await pilot.press("l")
        await wait_for(pilot, lambda: not log.display, what="log hidden")
        assert "open the log view first" in dash.why_not("find_in_log")


async def test_acknowledgements_are_toasts_of_the_outcome_and_k_opens_the_dump(make_app, agent, tmp_path):
    dump = tmp_path / "manual-2-1763200400-48302.txt"
    dump.write_text('Thread 48302 (idle): "MainThread"\n    _poll (multiprocessing/connection.py:440)\n')
    agent.replies["dump_stacks"] = {
        "ok": True,
        "error": None,
        "result": {"stacks": str(dump), "diagnosis": "snapshot", "detail": "main waits on the DataLoader"},
    }
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await replayed(pilot, agent)
        await pilot.press("a")
        await wait_for(pilot, lambda: toasts(app), what="toast")
        assert toasts(app)[-1].startswith("auto-recovery off"), toasts(app)
        await pilot.press("d")
        await wait_for(pilot, lambda: len(toasts(app)) == 2, what="second toast")
        assert toasts(app)[-1] == f"stacks written to {dump} (snapshot); k opens them"
        assert not any(": done" in t for t in toasts(app))
        await pilot.press("k")
        await shown(pilot, StacksScreen)
        area = app.screen.query_one("#stacks-text")
        await wait_for(pilot, lambda: "MainThread" in area.text, what="the dump")
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is app.dashboard, what="dashboard")


async def test_restart_says_what_it_will_do_to_this_run(make_app, agent):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await replayed(pilot, agent)
        m = app.dashboard.model
        cases = [
            (None, False, "There is no checkpoint yet: the trainer is killed and starts over"),
            (None, True, "The trainer saves now, is killed and resumed from that save"),
            (
                {"ts": app.dashboard.clock() - 120, "epoch": 2, "batch": None, "kind": "epoch", "lose": 140},
                False,
                "from the last good checkpoint: last checkpoint 2 m ago, end of epoch 2",
            ),
        ]
        for ckpt, saves, said in cases:
            m.projection = dataclasses.replace(m.projection, checkpoint=ckpt)
            if saves:
                m.note(SAVE_ON_REQUEST_KEY, "info", "this trainer saves on request", "", 0.0)
            await pilot.press("r")
            await shown(pilot, ConfirmScreen)
            body = app.screen.body
            assert said in body, body
            assert "last good checkpoint" not in body or ckpt is not None or saves
            await pilot.press("n")
            await wait_for(pilot, lambda: app.screen is app.dashboard, what="dashboard")
            m.warnings.pop(SAVE_ON_REQUEST_KEY, None)
        assert agent.commands == []


@pytest.mark.parametrize("rows", [6, 8, 19, 21, 34])
def test_chart_y_labels_fall_on_evenly_spaced_rows(rows):
    """plotext puts each label on the row its value rounds to: labels a fixed number of
    rows apart need values a fixed step apart with (rows - 1) a multiple of the gaps."""
    from trainctl.tui.widgets.loss_chart import even_ticks

    ticks = even_ticks(1.08, 3.57, rows)
    values = [v for v, _ in ticks]
    gaps = len(ticks) - 1
    assert (rows - 1) % gaps == 0 and 1 <= (rows - 1) // gaps <= 5, (rows, gaps)
    on_rows = [round((v - 1.08) / (3.57 - 1.08) * (rows - 1)) for v in values]
    assert len({b - a for a, b in zip(on_rows, on_rows[1:])}) == 1, on_rows
    assert values[0] == 1.08 and values[-1] == pytest.approx(3.57)
    assert len({len(label.split(".")[-1]) for _, label in ticks}) == 1  # one number of decimals


async def test_a_declared_rate_is_said_on_the_dashboard_until_one_is_measured(make_app, agent, journal):
    """Batch 1 of a new attempt under preset A: the rate on screen is A's declared figure,
    and both panels say so; the next projection's measured rate goes without words."""
    from trainctl.tui.widgets.progress_panel import ProgressPanel

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await replayed(pilot, agent)
        t = journal[-1].ts
        agent.append(ev.Progress(t + 1, 1, 3, 1, 300, {"box_loss": 1.0}))  # no rate of its own
        agent.append(
            ev.Projection(
                t + 1,
                eta=t + 400,
                deadline=None,
                buffer_s=None,
                rate=2.4,
                cost_so_far=None,
                cost_at_eta=None,
                rate_source="declared",
                preset="A",
            )
        )
        panel = app.dashboard.query_one(ProgressPanel)
        await wait_for(pilot, lambda: panel.info.rate == 2.4, what="the declared rate")
        await pilot.pause()
        text = screen_text(app)
        assert "2.40 it/s (declared by preset A, not measured yet)" in text, text
        assert "at 2.40 it/s (declared" in text, text  # the Deadline panel too
        agent.append(
            ev.Projection(
                t + 3,
                eta=t + 30,
                deadline=None,
                buffer_s=None,
                rate=14.3,
                cost_so_far=None,
                cost_at_eta=None,
                rate_source="measured",
                preset="A",
            )
        )
        await wait_for(pilot, lambda: panel.info.rate == 14.3, what="the measured rate")
        await pilot.pause()
        text = screen_text(app)
        assert "14.30 it/s ·" in text and "declared" not in text, text
