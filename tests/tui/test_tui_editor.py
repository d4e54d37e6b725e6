"""Pilot tests of the preset editor: inline validation, diff, save paths, comments kept."""

from __future__ import annotations

import pytest
from textual.message import Message
from textual.notifications import Notify
from textual.widgets import Input, Select, TextArea
from tui_helpers import replayed, screen_text, shown, wait_for

from trainctl.tui.screens.confirm import ConfirmScreen
from trainctl.tui.screens.name_prompt import NamePrompt
from trainctl.tui.screens.preset_editor import PresetEditorScreen

pytestmark = pytest.mark.timeout(60)


async def open_editor(pilot, agent) -> PresetEditorScreen:
    app = pilot.app
    await replayed(pilot, agent)
    await pilot.press("e")
    await shown(pilot, PresetEditorScreen)
    await pilot.pause()
    return app.screen


async def set_field(pilot, editor, field_id: str, value: str) -> None:
    widget = editor.query_one(f"#field-{field_id}")
    if isinstance(widget, TextArea):
        widget.text = value
    elif isinstance(widget, Select):
        widget.value = value
    else:
        widget.value = value
    await pilot.pause()


async def test_form_shows_every_field_of_the_running_preset(make_app, agent):
    app = make_app()
    async with app.run_test(size=(120, 50)) as pilot:
        editor = await open_editor(pilot, agent)
        assert agent.commands == [("read_preset", {"name": "B"})]
        assert editor.query_one("#field-dataloader-workers", Input).value == "0"
        assert editor.query_one("#field-threads-omp_num_threads", Input).value == "2"
        assert editor.query_one("#field-train", TextArea).text == ""
        assert editor.query_one("#field-dataloader-multiprocessing_context", Select).value == Select.NULL
        text = screen_text(app)
        for label in (
            "description",
            "expected_rate",
            "[dataloader]",
            "persistent_workers",
            "prefetch_factor",
            "sharing_strategy",
            "[threads]",
            "torch_num_threads",
            "[train]",
            "[env]",
            "args",
            "✓ valid",
        ):
            assert label in text, label


async def test_bad_value_is_named_inline_and_blocks_saving(make_app, agent, presets):
    messages: list[Message] = []
    app = make_app()
    before = presets["B"].read_text()
    async with app.run_test(size=(120, 50), message_hook=messages.append) as pilot:
        editor = await open_editor(pilot, agent)
        await set_field(pilot, editor, "dataloader-workers", "two")
        error = str(editor.query_one("#error-dataloader-workers").render())
        assert "[dataloader] workers" in error and "integer >= 0" in error
        assert editor.query_one("#row-dataloader-workers").has_class("-invalid")
        assert editor.query_one("#save").disabled
        # a rule across keys: prefetch_factor needs workers > 0 (B has workers = 0)
        await set_field(pilot, editor, "dataloader-workers", "0")
        await set_field(pilot, editor, "dataloader-prefetch_factor", "2")
        assert "[dataloader] prefetch_factor: only allowed with [dataloader] workers > 0" in screen_text(app)
        await set_field(pilot, editor, "env", "MIOPEN_DEBUG=1\nnot a line")
        assert "[env]: line 2: expected NAME=value" in screen_text(app)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: any(isinstance(m, Notify) for m in messages), what="toast")
        assert not isinstance(app.screen, ConfirmScreen)
        assert [n for n, _ in agent.commands] == ["read_preset"]
        assert presets["B"].read_text() == before


async def test_save_shows_the_diff_and_keeps_comments(make_app, agent, presets):
    app = make_app()
    async with app.run_test(size=(120, 50)) as pilot:
        editor = await open_editor(pilot, agent)
        await set_field(pilot, editor, "dataloader-workers", "1")
        await set_field(pilot, editor, "train", "val = false\nbatch = 8")
        await set_field(pilot, editor, "env", "MIOPEN_USER_DB_PATH=/tmp/miopen")
        await pilot.press("ctrl+s")
        await shown(pilot, ConfirmScreen)
        assert "-workers = 0" in screen_text(app) and "+workers = 1" in screen_text(app)
        diff = app.screen.body.code  # the whole diff (the modal scrolls)
        assert "+batch = 8" in diff and '+MIOPEN_USER_DB_PATH = "/tmp/miopen"' in diff
        await pilot.press("n")  # cancel: nothing is written
        await wait_for(pilot, lambda: app.screen is editor, what="editor again")
        assert [n for n, _ in agent.commands] == ["read_preset"]
        await pilot.press("ctrl+s")
        await shown(pilot, ConfirmScreen)
        await pilot.press("y")
        await wait_for(pilot, lambda: len(agent.commands) == 2, what="write_preset")
        name, args = agent.commands[1]
        assert name == "write_preset" and args["name"] == "B"
        saved = presets["B"].read_text()
        assert saved == args["text"]
        for comment in ('# Preset B: "safe".', "# load in the training process", "Validation stays on"):
            assert comment in saved, comment
        assert "workers = 1" in saved and "batch = 8" in saved
        assert 'MIOPEN_USER_DB_PATH = "/tmp/miopen"' in saved
        await wait_for(pilot, lambda: not editor.dirty, what="clean")


@pytest.mark.parametrize(
    "key,follow",
    [("ctrl+r", ("switch_preset", {"preset": "B"})), ("ctrl+t", ("set_next_preset", {"name": "B"}))],
)
async def test_save_then_restart_or_next(make_app, agent, key, follow):
    app = make_app()
    async with app.run_test(size=(120, 50)) as pilot:
        editor = await open_editor(pilot, agent)
        await set_field(pilot, editor, "threads-torch_num_threads", "3")
        await pilot.press(key)
        await shown(pilot, ConfirmScreen)
        await pilot.press("y")
        await wait_for(pilot, lambda: len(agent.commands) == 3, what="follow-up")
        assert [n for n, _ in agent.commands] == ["read_preset", "write_preset", follow[0]]
        assert agent.commands[2] == follow


async def test_agent_refusal_is_shown(make_app, agent):
    messages: list[Message] = []
    agent.replies["write_preset"] = {
        "ok": False,
        "result": None,
        "error": "B.toml: [threads] omp_num_threads: refused",
    }
    app = make_app()
    async with app.run_test(size=(120, 50), message_hook=messages.append) as pilot:
        editor = await open_editor(pilot, agent)
        await set_field(pilot, editor, "threads-omp_num_threads", "4")
        await pilot.press("ctrl+s")
        await shown(pilot, ConfirmScreen)
        await pilot.press("y")
        await wait_for(pilot, lambda: any(isinstance(m, Notify) for m in messages), what="toast")
        [note] = [m.notification for m in messages if isinstance(m, Notify)]
        assert "[threads] omp_num_threads" in note.message and note.severity == "error"
        assert editor.dirty


async def test_new_preset_from_this_one(make_app, agent, presets):
    app = make_app()
    async with app.run_test(size=(120, 50)) as pilot:
        editor = await open_editor(pilot, agent)
        await set_field(pilot, editor, "description", "B with one worker")
        await set_field(pilot, editor, "dataloader-workers", "1")
        await pilot.press("ctrl+n")
        await shown(pilot, NamePrompt)
        await pilot.press("A", "enter")  # taken
        await pilot.pause()
        assert "A already exists" in screen_text(app)
        prompt = app.screen.query_one(Input)
        prompt.value = ""
        await pilot.press("B", "1", "enter")
        await wait_for(pilot, lambda: app.screen is editor, what="editor")
        await wait_for(
            pilot, lambda: any(n == "write_preset" for n, _ in agent.commands), what="write_preset"
        )
        [args] = agent.names("write_preset")
        assert args["name"] == "B1" and 'description = "B with one worker"' in args["text"]
        assert "# load in the training process" in args["text"]
        assert presets["B1"].read_text() == args["text"]
        assert "workers = 0" in presets["B"].read_text()  # the original is untouched
        assert editor.preset_name == "B1" and not editor.dirty


async def test_close_asks_before_dropping_changes(make_app, agent):
    app = make_app()
    async with app.run_test(size=(120, 50)) as pilot:
        editor = await open_editor(pilot, agent)
        await set_field(pilot, editor, "args", "--cache ram")
        await pilot.press("escape")
        await shown(pilot, ConfirmScreen)
        await pilot.press("n")
        await wait_for(pilot, lambda: app.screen is editor, what="editor")
        await pilot.press("escape")
        await shown(pilot, ConfirmScreen)
        await pilot.press("y")
        await wait_for(pilot, lambda: app.screen is app.dashboard, what="dashboard")
        assert [n for n, _ in agent.commands] == ["read_preset"]


async def test_a_bad_value_in_the_file_is_shown_not_hidden(make_app, agent, presets):
    presets["B"].write_text(
        presets["B"].read_text().replace("workers = 0 ", 'workers = 2\nmultiprocessing_context = "thread" ')
    )
    app = make_app()
    async with app.run_test(size=(120, 50)) as pilot:
        editor = await open_editor(pilot, agent)
        select = editor.query_one("#field-dataloader-multiprocessing_context", Select)
        assert select.value == "thread"
        assert "[dataloader] multiprocessing_context: must be one of" in screen_text(app)
        await set_field(pilot, editor, "dataloader-multiprocessing_context", "spawn")
        assert "✓ valid" in screen_text(app)


async def test_run_keeps_updating_behind_the_editor(make_app, agent, journal):
    from trainctl.core import events as ev

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await open_editor(pilot, agent)
        last = journal[-1]
        for i in range(1, 41):
            agent.append(
                ev.Progress(
                    last.ts + i,
                    epoch=3,
                    epochs=3,
                    batch=140 + i,
                    batches=300,
                    losses={"box_loss": 1.2},
                    rate=2.1,
                )
            )
            agent.emit(ev.Log(last.ts + i, lines=("a trainer line",) * 200))
            await pilot.pause(0.005)
        await replayed(pilot, agent)
        assert app.dashboard.model.progress.batch == 180
        assert isinstance(app.screen, PresetEditorScreen)


async def test_the_palette_reaches_the_editor_keys_a_browser_keeps(make_app, agent):
    """In a browser (`trainctl serve`) ctrl+t and ctrl+n open a tab and a window, never reaching
    the page: the palette (ctrl+p) lists the editor's keys and runs them."""
    app = make_app()
    async with app.run_test(size=(120, 50)) as pilot:
        editor = await open_editor(pilot, agent)
        titles = [c.title for c in app.get_system_commands(editor)]
        assert "Save for next (ctrl+t)" in titles and "New from this (ctrl+n)" in titles, titles
        await set_field(pilot, editor, "threads-torch_num_threads", "3")
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"Save for next", "enter")
        await shown(pilot, ConfirmScreen)
        await pilot.press("y")
        await wait_for(pilot, lambda: len(agent.commands) == 3, what="follow-up")
        assert agent.commands[2] == ("set_next_preset", {"name": "B"})
