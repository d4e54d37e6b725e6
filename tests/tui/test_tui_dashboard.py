"""Pilot tests: the dashboard over a replayed journal, every key, confirms, reconnects."""

from __future__ import annotations

import math

import pytest
from textual.message import Message
from textual.notifications import Notify
from tui_helpers import replayed, screen_text, shown, tick, wait_for

from trainctl.core import events as ev
from trainctl.tui.messages import AgentDisconnected, CommandDone, EventBatch
from trainctl.tui.model import LOG_KEEP
from trainctl.tui.screens.confirm import ConfirmScreen
from trainctl.tui.screens.help import HelpScreen
from trainctl.tui.screens.preset_picker import PresetPicker
from trainctl.tui.widgets.log_tail import LogTail

pytestmark = pytest.mark.timeout(60)


def toasts(app) -> list[str]:
    """The notifications' texts, oldest first."""
    return [n.message for n in app._notifications]


def finite_losses(events: list[ev.Event]) -> int:
    return sum(1 for e in events if isinstance(e, ev.Progress) for v in e.losses.values() if math.isfinite(v))


async def test_replay_shows_the_whole_run_in_few_messages(make_app, agent, journal):
    messages: list[Message] = []
    app = make_app()
    async with app.run_test(size=(160, 48), message_hook=messages.append) as pilot:
        await replayed(pilot, agent)
        model = app.dashboard.model
        assert model.chart_points() == finite_losses(journal)
        restarts = [e for e in journal if isinstance(e, ev.Restart)]
        assert [label for _, label in model.restarts] == [f"#{r.attempt} {r.preset}" for r in restarts]
        batches = [m for m in messages if isinstance(m, EventBatch)]
        assert sum(len(b.events) for b in batches) == len(journal)
        assert len(batches) < len(journal) / 20
        text = screen_text(app)
        for expected in (
            "yolo-rocm@gpu-box",
            "preset B",
            "RUNNING",
            "attempt 2",
            "auto-recover on",
            "connected",
            "Epoch 3/3",
            "Batch 140/300",
            "no batch for 61 s in train",
            "workqueue: svm_range_restore_work",
            "last stall: deadlock",
            "stacks/stall-1-",
            "buffer +2 h 50 m",
            "A (expected 2.4 it/s): ETA",
        ):
            assert expected in text, expected
        # the panel says what happened in words: no internal ids, no info notes
        for internal in ("stall.deadlock", "kernel.amdgpu.wq_hog", "rocm.miopen"):
            assert internal not in text, internal
        # warnings are counted and newest first
        rows = model.warning_rows()
        assert rows[0].id == "stall.deadlock"
        assert model.warnings["rocm.miopen.is_enough_workspace"].count > 1


@pytest.mark.parametrize("key,command,args", [("r", "restart", {}), ("f", "fallback", {}), ("s", "stop", {})])
async def test_destructive_keys_confirm_first(make_app, agent, key, command, args):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await replayed(pilot, agent)
        for cancel in ("n", "escape"):
            await pilot.press(key)
            await shown(pilot, ConfirmScreen)
            await pilot.press(cancel)
            await wait_for(pilot, lambda: app.screen is app.dashboard, what="dashboard")
        await pilot.pause(0.05)
        assert agent.commands == []  # cancel sends nothing
        await pilot.press(key)
        await shown(pilot, ConfirmScreen)
        await pilot.press("y")
        await wait_for(pilot, lambda: agent.commands, what=command)
        assert agent.commands == [(command, args)]


async def test_dump_stacks_and_auto_recover_toggle(make_app, agent):
    messages: list[Message] = []
    app = make_app()
    async with app.run_test(size=(120, 40), message_hook=messages.append) as pilot:
        await replayed(pilot, agent)
        await pilot.press("d")
        await wait_for(pilot, lambda: agent.commands, what="dump_stacks")
        await pilot.press("a")
        await wait_for(pilot, lambda: len(agent.commands) == 2, what="auto_recover")
        assert agent.commands == [("dump_stacks", {}), ("auto_recover", {"on": False})]
        await wait_for(pilot, lambda: "auto-recover OFF" in screen_text(app), what="OFF")
        done = [m.name for m in messages if isinstance(m, CommandDone)]
        assert done == ["dump_stacks", "auto_recover"]
        await pilot.press("a")
        await wait_for(pilot, lambda: len(agent.commands) == 3, what="auto_recover on")
        assert agent.commands[-1] == ("auto_recover", {"on": True})


async def test_pick_preset_restarts_with_the_choice(make_app, agent):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await replayed(pilot, agent)
        await pilot.press("p")
        await shown(pilot, PresetPicker)
        assert "(running now)" in screen_text(app)
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is app.dashboard, what="dashboard")
        assert agent.commands == [("list_presets", {})]
        await pilot.press("p")
        await shown(pilot, PresetPicker)
        await pilot.press("home", "enter")  # A is first
        await wait_for(pilot, lambda: len(agent.commands) == 3, what="switch_preset")
        assert agent.commands[-1] == ("switch_preset", {"preset": "A"})


async def test_log_toggle_shows_bounded_raw_output(make_app, agent, journal):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await replayed(pilot, agent)
        log = app.dashboard.query_one(LogTail)
        assert not log.display
        agent.emit(ev.Log(journal[-1].ts, lines=tuple(f"line {i}" for i in range(LOG_KEEP + 1000))))
        await wait_for(pilot, lambda: len(app.dashboard.model.log) == LOG_KEEP, what="log lines")
        await pilot.press("l")
        await wait_for(pilot, lambda: log.display and log.region.height > 0, what="log shown")
        assert log.line_count == LOG_KEEP and log.lines[-1] == f"line {LOG_KEEP + 999}"
        agent.emit(ev.Log(journal[-1].ts, lines=("the newest line",)))
        await wait_for(pilot, lambda: log.lines[-1] == "the newest line", what="live line")
        await pilot.press("l")
        await wait_for(pilot, lambda: not log.display, what="log hidden")


async def test_help_lists_every_key(make_app, agent):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await replayed(pilot, agent)
        await pilot.press("question_mark")
        await shown(pilot, HelpScreen)
        text = screen_text(app)
        for binding in app.dashboard.BINDINGS:
            assert binding.description in text and binding.tooltip, binding.id
            assert binding.id
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is app.dashboard, what="dashboard")
        assert agent.commands == []


async def test_palette_has_every_action(make_app, agent):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await replayed(pilot, agent)
        titles = [c.title for c in app.get_system_commands(app.dashboard)]
        for binding in app.dashboard.BINDINGS:
            if not binding.action.startswith("app."):
                assert any(t.startswith(binding.description) for t in titles), binding.id
        assert "Leave (q)" in titles
        command = next(c for c in app.get_system_commands(app.dashboard) if c.title.startswith("Stacks"))
        await command.callback()
        await wait_for(pilot, lambda: agent.commands, what="dump_stacks from the palette")
        assert agent.commands == [("dump_stacks", {})]


@pytest.mark.parametrize(
    "hint,expected",
    [
        ("", "trainctl attach /home/ana/runs/yolo-rocm-20251115"),
        ("ssh://gpu-box/home/ana/runs/x", "trainctl attach ssh://gpu-box/home/ana/runs/x"),
    ],
)
async def test_quit_leaves_the_run_going(make_app, agent, hint, expected):
    app = make_app(attach_hint=hint)
    async with app.run_test(size=(120, 40)) as pilot:
        await replayed(pilot, agent)
        await pilot.press("q")
        await wait_for(pilot, lambda: app._exit, what="exit")
    assert app.return_value == 0
    assert expected in app.exit_message.splitlines()[-1]
    assert "stop" not in [name for name, _ in agent.commands]


async def test_failed_command_notifies_with_the_error(make_app, agent):
    messages: list[Message] = []
    agent.replies["restart"] = {"ok": False, "error": "restart refused: no checkpoint yet", "result": None}
    app = make_app()
    async with app.run_test(size=(120, 40), message_hook=messages.append) as pilot:
        await replayed(pilot, agent)
        await pilot.press("r")
        await shown(pilot, ConfirmScreen)
        await pilot.press("y")
        await wait_for(pilot, lambda: any(isinstance(m, Notify) for m in messages), what="toast")
        [note] = [m.notification for m in messages if isinstance(m, Notify)]
        assert note.message == "restart refused: no checkpoint yet"
        assert note.severity == "error" and "restart" in note.title


async def test_reconnects_without_gap_or_duplicates(make_app, agent, journal):
    messages: list[Message] = []
    app = make_app()
    app.bridge._backoff_min = 0.05
    async with app.run_test(size=(120, 40), message_hook=messages.append) as pilot:
        await replayed(pilot, agent)
        before = app.dashboard.model.chart_points()
        agent.drop()
        await wait_for(pilot, lambda: not app.dashboard.connected, what="disconnect")
        await wait_for(pilot, lambda: "disconnected — retrying" in screen_text(app), what="header says so")
        assert app.dashboard.check_action("restart", ()) is None
        await pilot.press("r")
        await pilot.pause(0.05)
        assert not isinstance(app.screen, ConfirmScreen)
        # the run went on while we were away: 30 more batches journaled
        last = journal[-1]
        assert isinstance(last, ev.Progress)
        for i in range(1, 31):
            agent.append(
                ev.Progress(
                    last.ts + i,
                    epoch=3,
                    epochs=3,
                    batch=140 + 2 * i,
                    batches=300,
                    losses={"box_loss": 1.3, "cls_loss": 1.5, "dfl_loss": 1.1},
                    rate=2.1,
                )
            )
        await pilot.pause(0.2)  # a few refused attempts
        agent.restore()
        await wait_for(pilot, lambda: app.dashboard.connected, what="reconnect")
        await replayed(pilot, agent)
        assert agent.connects[0] == 0
        assert agent.connects[-1] == last.seq + 1
        assert app.dashboard.model.chart_points() == before + 30 * 3
        seqs = [e.seq for m in messages if isinstance(m, EventBatch) for e in m.events]
        assert seqs == sorted(set(seqs)) == list(range(len(agent.journal)))
        assert any(isinstance(m, AgentDisconnected) for m in messages)
        assert "● connected" in screen_text(app)


async def test_live_stall_and_resources(make_app, agent, journal):
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await replayed(pilot, agent)
        assert "waiting for the agent's probes" in screen_text(app)
        t = journal[-1].ts
        agent.emit(tick(t + 1, idle_s=45.0))
        await wait_for(pilot, lambda: "idle 45 s of 1 m" in screen_text(app), what="meter")
        assert app.dashboard.query_one("StallMeter").has_class("-warn")
        assert "no GPU" in screen_text(app) and "48330" in screen_text(app)
        agent.append(
            ev.Stall(
                t + 70,
                phase="train",
                idle_s=70.0,
                diagnosis="spin",
                cpu_percent=99.0,
                stacks=None,
                threshold_s=60.0,
                detail="main thread busy in a Python loop",
            )
        )
        agent.append(ev.State(t + 70, state="STALLED"))
        agent.emit(
            tick(
                t + 71,
                idle_s=71.0,
                gpu={
                    "util": 0.0,
                    "mem_used": 6.1 * 2**30,
                    "mem_total": 8 * 2**30,
                    "power_w": 31.0,
                    "name": "RX 5600 XT",
                },
            )
        )
        await wait_for(pilot, lambda: "STALLED: spin" in screen_text(app), what="stall")
        text = screen_text(app)
        assert "main thread busy in a Python loop" in text
        assert "GPU RX 5600 XT util 0%" in text and "6.1 GiB/8.0 GiB" in text
        assert app.dashboard.query_one("StallMeter").has_class("-alarm")
        assert app.dashboard.query_one("#hdr-state").has_class("-stalled")


async def test_finished_run_greys_out_restart(make_app, agent, journal):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await replayed(pilot, agent)
        t = journal[-1].ts
        agent.append(ev.Exit(t + 1, returncode=0))
        agent.append(ev.State(t + 1, state="FINISHED"))
        await wait_for(pilot, lambda: app.dashboard.run_state == "FINISHED", what="finished")
        for action in ("restart", "fallback", "pick_preset", "stop", "dump_stacks", "toggle_auto"):
            assert app.dashboard.check_action(action, ()) is False, action  # hidden
        assert app.dashboard.check_action("toggle_log", ()) is True
        await pilot.press("r")  # ...and a key pressed anyway says why, and how to go on
        await wait_for(pilot, lambda: toasts(app), what="why not")
        assert app.screen is app.dashboard and agent.commands == []
        assert toasts(app)[-1].startswith(
            "restart cannot act: the run is FINISHED. To go on from its "
            "last checkpoint: trainctl run JOB --resume-from "
            "/home/ana/runs/yolo-rocm-20251115"
        ), toasts(app)
        from trainctl.tui.widgets.stall_meter import StallMeter

        meter = app.dashboard.query_one(StallMeter)  # the panel says so too, wrapped
        assert (
            "to go on: trainctl run JOB --resume-from /home/ana/runs/yolo-rocm-20251115"
            in meter.render_info(meter.info, None).plain
        )


async def test_a_run_without_its_agent_shows_its_journal_and_says_so(tmp_path):
    """The real client on a run directory whose agent is gone: the whole journal replays,
    the header says there is no agent, and agent keys answer with the reason."""
    from trainctl.client.connection import local_client
    from trainctl.store.journal import Journal
    from trainctl.store.paths import RunFiles
    from trainctl.store.spec import RunSpec
    from trainctl.tui.app import TrainctlApp

    files = RunFiles(tmp_path / "run")
    files.dir.mkdir()
    RunSpec(job_name="old-run", kind="command", preset="A", fallback="B").save(files.spec)
    j = Journal(files.events)
    j.append(ev.Start(100.0, 1, 7, "A", ("python", "t.py")))
    for b in range(1, 6):
        j.append(ev.Progress(100.0 + b, 1, 1, b, 5, {"loss": 1.0 / b}))
    j.append(ev.State(107.0, "FINISHED", "the trainer finished"))
    j.close()
    app = TrainctlApp(lambda: local_client(files.dir))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.model.last_seq == 6, what="the journal replayed")
        await wait_for(pilot, lambda: "no agent running" in screen_text(app), what="the offline label")
        text = screen_text(app)
        assert "FINISHED" in text and "Batch 5/5" in text, text
        assert app.dashboard.model.chart_points() == 5


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_a_finished_run_shows_when_it_ended_not_a_stale_eta_or_processes(
    make_app, agent, journal, size
):
    """After the end: 'finished HH:MM (… ago)' (never 'ETA … (in -5 s)'), no stall meter
    counting, no processes from the last tick; at 80 columns the job name stays readable."""
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await replayed(pilot, agent)
        agent.emit(tick(journal[-1].ts + 1))
        await wait_for(pilot, lambda: "48302" in screen_text(app), what="the trainer's pid")
        t = journal[-1].ts
        agent.append(ev.Exit(t + 1.5, 0, None))
        agent.append(
            ev.Projection(
                t + 1.5,
                eta=t + 1.5,
                deadline=t + 10_000,
                buffer_s=9_998.5,
                rate=2.1,
                cost_so_far=0.16,
                cost_at_eta=0.16,
                budget=3.0,
                finished=True,
            )
        )
        agent.append(ev.State(t + 1.6, "FINISHED", "done"))
        await wait_for(pilot, lambda: app.dashboard.model.state == "FINISHED", what="FINISHED")
        await pilot.pause()
        text = screen_text(app)
        assert "finished Nov 15" in text and "(in -" not in text and "ETA Nov" not in text, text
        assert "run FINISHED: nothing left to watch" in text, text
        assert "cost $0.16 of $3.00" in text or "cost $0.16 in all" in text, text
        assert "run FINISHED: no trainer process" in text and "48302" not in text, text
        header = text.splitlines()[0]
        assert "yolo-rocm@gpu-box" in header and "attempt 2" in header, header


async def test_a_stopped_run_says_stopped_not_finished_and_quits_with_130(make_app, agent, journal):
    """`s` at epoch 3/3: STOPPED in its own colour, no stale ETA, nothing to restart or
    stop; leaving exits 130, as `trainctl run` does for a stop (or Ctrl-C)."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await replayed(pilot, agent)
        assert "ETA" in screen_text(app)
        t = journal[-1].ts
        agent.append(ev.State(t + 1, "STOPPING", "stopped by the user"))
        agent.append(ev.Exit(t + 2, -15, "SIGTERM"))
        agent.append(ev.State(t + 2, "STOPPED", "stopped by the user"))
        await wait_for(pilot, lambda: app.dashboard.run_state == "STOPPED", what="STOPPED")
        await pilot.pause()
        text = screen_text(app)
        header = app.dashboard.query_one("#hdr-state")
        assert header.has_class("-stopped") and not header.has_class("-finished")
        assert "STOPPED" in text.splitlines()[0] and "finished" not in text.lower(), text
        assert "run stopped: no ETA" in text and "ETA Nov" not in text, text
        assert "run STOPPED: nothing left to watch" in text, text
        for action in ("restart", "fallback", "pick_preset", "stop", "dump_stacks"):
            assert app.dashboard.check_action(action, ()) is False, action
        await pilot.press("q")
        await wait_for(pilot, lambda: app._exit, what="exit")
    assert app.return_value == 130 and app.return_code == 130
    assert "The run is STOPPED" in app.exit_message


def test_the_loss_legend_is_in_the_chart_border_not_over_the_curves():
    from trainctl.tui.widgets.loss_chart import ChartData, legend

    data = ChartData(
        (("box_loss", (1.0,), (2.0,)), ("cls_loss", (1.0,), (1.0,)), ("loss", (1.0,), (0.5,))),
        ((5.0, "#2 B"),),
    )
    assert legend(data) == (
        "Loss [cyan]━ box_loss[/] [magenta]━ cls_loss[/] [green]━ loss[/] [red]│ restart[/]"
    )
    assert legend(data, short=True).startswith("Loss [cyan]━ box[/] [magenta]━ cls[/] [green]━ loss[/]")
    assert legend(ChartData()) == "Loss"


async def test_the_loss_legend_follows_the_chart_width(make_app, agent, journal):
    from trainctl.tui.widgets.loss_chart import LossChart

    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await replayed(pilot, agent)
        chart = app.dashboard.query_one(LossChart)
        chart.flush()
        await wait_for(pilot, lambda: "box_loss" in str(chart.border_title), what="long legend")
        await pilot.resize_terminal(80, 24)
        await wait_for(
            pilot,
            lambda: "━ box[" in str(chart.border_title) and "box_loss" not in str(chart.border_title),
            what="short legend",
        )
        await pilot.resize_terminal(160, 48)
        await wait_for(pilot, lambda: "box_loss" in str(chart.border_title), what="long again")


PAYLOADS = (
    "\x1b\b]52;c;Y3VybCBldmlsfHNo\x1b\b\\",
    "\x1b]0;pwned\x07",
    "\x1bc",
    "\x1b(0",
    "\x9d52;c;QUFB\x07",
    "\x0e\x0f",
    "[bold red]markup[/]",
)


def _terminal_text(app) -> str:
    """Every segment's text on the screen: what Textual writes to the terminal as is (its
    own escape codes come from styles, never from a segment's text)."""
    strips = app.screen._compositor.render_strips()
    return "".join(segment.text for strip in strips for segment in strip)


async def test_trainer_escape_sequences_never_reach_the_terminal(make_app, agent, journal):
    """Issue 14: the warnings panel turned a malformed OSC 52 into a clean clipboard write."""
    import re

    bad = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await replayed(pilot, agent)
        t = journal[-1].ts
        text = "evil " + " ".join(PAYLOADS) + " end"
        agent.append(
            ev.Warning(
                t + 1,
                id="zz.evil\x1b]0;t\x07",
                severity="fatal",
                text=text,
                advice="advice " + PAYLOADS[0],
                source="trainer",
            )
        )
        agent.append(
            ev.Progress(
                t + 2, epoch=3, epochs=3, batch=150, batches=300, losses={"box\x1b]0;t\x07_loss": 0.5}
            )
        )
        agent.append(ev.State(t + 3, state="RUNNING", reason="x\x1b]52;c;AA\x07y"))
        agent.emit(ev.Log(t + 3, lines=tuple(f"log {p} line" for p in PAYLOADS)))
        model = app.dashboard.model
        await wait_for(pilot, lambda: "zz.evil" in model.warnings, what="the warning")
        await wait_for(pilot, lambda: len(model.log) >= len(PAYLOADS), what="log lines")
        row = model.warnings["zz.evil"]
        assert row.text.startswith("evil ") and row.text.endswith(" end")
        assert "[bold red]markup[/]" in row.text  # shown as text, not markup
        assert "box_loss" in model.losses
        # the warning is the newest row; selected, its text and advice show below the table
        from textual.widgets import DataTable

        await wait_for(pilot, lambda: "evil " in _terminal_text(app), what="the row")
        app.dashboard.query_one("#warnings-table", DataTable).move_cursor(row=0)
        await wait_for(
            pilot, lambda: "evil" in _terminal_text(app).replace("zz.evil", ""), what="the warning's text"
        )
        shown_text = _terminal_text(app)
        assert "evil" in shown_text and "markup" in shown_text
        assert "\x1b" not in shown_text and not bad.search(shown_text)
        await pilot.press("l")
        log = app.dashboard.query_one(LogTail)
        await wait_for(pilot, lambda: log.display and log.region.height > 0, what="log shown")
        await pilot.pause()
        assert all("\x1b" not in line and not bad.search(line) for line in log.lines)
        assert "log [bold red]markup[/] line" in log.lines
        shown_text = _terminal_text(app)
        assert "\x1b" not in shown_text and not bad.search(shown_text)


async def test_the_last_checkpoint_and_what_a_restart_now_loses_are_shown(make_app, agent, journal):
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await replayed(pilot, agent)
        t = journal[-1].ts
        last = [e for e in journal if isinstance(e, ev.Projection)][-1]
        agent.append(
            ev.Projection(
                t + 1,
                last.eta,
                last.deadline,
                last.buffer_s,
                last.rate,
                last.cost_so_far,
                last.cost_at_eta,
                redone=(0, 3),
                checkpoint={"ts": t - 180, "epoch": 2, "batch": 700, "kind": "periodic", "lose": 12},
            )
        )
        await wait_for(pilot, lambda: "epoch 2 batch 700" in screen_text(app), what="checkpoint line")
        text = screen_text(app)
        assert "a restart now loses 12 batches" in text and "redone per restart: 0, 3" in text


async def test_attach_from_a_snapshot_shows_what_a_replay_shows(make_app, agent, journal):
    from trainctl.core.runview import RunView

    agent.snapshot_over = 0
    app = make_app()
    messages: list[Message] = []
    async with app.run_test(size=(160, 48), message_hook=messages.append) as pilot:
        await replayed(pilot, agent)
        model = app.dashboard.model
        assert model.job == "yolo-rocm" and model.fallback == "B"  # the hello's, kept
        agent.append(
            ev.Progress(
                journal[-1].ts + 1,
                epoch=3,
                epochs=3,
                batch=299,
                batches=300,
                losses={"box_loss": 0.5},
                rate=2.0,
            )
        )
        await replayed(pilot, agent)
        folded = RunView()
        folded.apply_all(agent.journal)
        model = app.dashboard.model
        assert model.state_key() == folded.state_key()
        batches = [m for m in messages if isinstance(m, EventBatch)]
        assert sum(b.snapshot is not None for b in batches) == 1
        assert sum(len(b.events) for b in batches) == 1  # the new event: the rest came in the view
        assert [r.id for r in model.warning_rows()] == [r.id for r in folded.warning_rows()]


async def test_z_cycles_the_loss_charts_range(make_app, agent):
    from trainctl.tui.widgets.loss_chart import LossChart

    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await replayed(pilot, agent)
        chart = app.dashboard.query_one(LossChart)
        whole = app.dashboard.chart_data()
        for span, label in (("hour", "(last hour)"), ("epoch", "(this epoch)"), ("run", "")):
            await pilot.press("z")
            assert app.dashboard.chart_range == span
            chart.flush()
            await wait_for(
                pilot, lambda label=label: label in str(chart.border_title), what=label or "whole run"
            )
            data = app.dashboard.chart_data()
            if span == "epoch":  # epoch 3 only: from its first batch on
                assert min(data.series[0][1]) >= 2 * 300 and len(data.series[0][1]) < len(whole.series[0][1])
        assert "(last" not in str(chart.border_title) and app.dashboard.chart_data() == whole


async def test_t_shows_where_the_time_went_and_the_line_is_under_the_projection(make_app, agent):
    from trainctl.tui.screens.goodput import GoodputScreen

    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await replayed(pilot, agent)
        totals = app.dashboard.goodput_now()
        assert totals["ratio"] is not None and 0 < totals["ratio"] < 1
        assert "goodput " in screen_text(app)
        await pilot.press("t")
        await shown(pilot, GoodputScreen)
        text = screen_text(app)
        for word in ("productive", "detection", "restart start-up", "work redone", "wall time"):
            assert word in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is app.dashboard, what="dashboard")
        assert agent.commands == []


def _run_gpus() -> dict:
    """A tick's ``gpu`` of a run on GPUs 2 and 3 (agent/gpus.py), chosen by its pids."""

    def device(index: int, util: float, used: float) -> dict:
        return {
            "index": index,
            "name": "NVIDIA A100-SXM4-80GB",
            "util": util,
            "mem_used": used * 2**30,
            "mem_total": 80 * 2**30,
            "temperature_c": 61.0,
            "power_w": 312.0,
            "processes": [],
        }

    rows = [device(2, 97.0, 30.5), device(3, 95.0, 29.0)]
    return {**rows[0], "devices": rows, "rule": "pids", "why": "the driver lists the run's pid(s) 4242, 4243"}


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_the_runs_gpus_have_a_row_each_in_the_resources_panel(make_app, agent, journal, size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await replayed(pilot, agent)
        agent.emit(tick(journal[-1].ts + 1, gpu=_run_gpus()))
        await wait_for(pilot, lambda: "gpu 3 " in screen_text(app), what="the device rows")
        text = screen_text(app)
        wide = size[0] >= 120
        # the model, once, in the title (narrow: the title is the model)
        assert ("Resources · " if wide else "─ ") + "2× NVIDIA A100-SXM4-80GB ─" in text
        assert "more process" in text or "48330" in text  # the process rows give way, counted
        for index, util, mem in ((2, "97%", "30.5/80.0 GiB"), (3, "95%", "29.0/80.0 GiB")):
            row = next(line for line in text.splitlines() if f"gpu {index} " in line)
            if wide:
                assert f"util {util} · mem {mem} · 61 °C · 312 W" in row, row
            else:  # the narrow panel: no labels, no temperature, nothing cut
                assert f"gpu {index} {util} · {mem} · 312 W" in row and "…" not in row, row
        assert "GPU 0" not in text and "gpu 0 " not in text
